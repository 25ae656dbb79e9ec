#include "agent/fabric/fabric_keys.h"

#include <openssl/crypto.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "agent/common/status_macros.h"

namespace fuselink::fabric {
namespace {

void Wipe(std::optional<SessionKey>& key) {
  if (key.has_value()) OPENSSL_cleanse(key->data(), key->size());
  key.reset();
}

}  // namespace

absl::Status FillRandom(std::span<uint8_t> out) {
  size_t filled = 0;
  while (filled < out.size()) {
    // Requests of up to 256 bytes are never cut short once the pool is seeded; a
    // signal while it is still seeding is the only EINTR.
    const ssize_t got = getrandom(out.data() + filled, out.size() - filled, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("getrandom", errno);
    }
    filled += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionKey> RandomKey() {
  SessionKey key;
  FL_RETURN_IF_ERROR(FillRandom(key));
  return key;
}

FabricKeys::~FabricKeys() {
  absl::MutexLock lock(&mu_);
  for (auto& [peer, keys] : keys_) {
    Wipe(keys.accept);
    Wipe(keys.connect);
  }
}

SessionKey FabricKeys::AcceptKey(absl::string_view peer) {
  absl::MutexLock lock(&mu_);
  Keys& keys = keys_[peer];
  if (!keys.accept.has_value()) {
    absl::StatusOr<SessionKey> made = RandomKey();
    if (!made.ok()) {
      std::fprintf(stderr, "fuselink: cannot make a fabric key: %s\n",
                   made.status().ToString().c_str());
      std::abort();
    }
    keys.accept = *made;
  }
  return *keys.accept;
}

std::optional<SessionKey> FabricKeys::FindAcceptKey(absl::string_view peer) const {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(peer);
  if (it == keys_.end()) return std::nullopt;
  return it->second.accept;
}

void FabricKeys::SetConnectKey(absl::string_view peer, const SessionKey& key) {
  absl::MutexLock lock(&mu_);
  keys_[peer].connect = key;
}

std::optional<SessionKey> FabricKeys::FindConnectKey(absl::string_view peer) const {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(peer);
  if (it == keys_.end()) return std::nullopt;
  return it->second.connect;
}

void FabricKeys::Forget(absl::string_view peer) {
  absl::MutexLock lock(&mu_);
  auto it = keys_.find(peer);
  if (it == keys_.end()) return;
  Wipe(it->second.accept);
  Wipe(it->second.connect);
  keys_.erase(it);
}

}  // namespace fuselink::fabric
