#include "agent/fabric/fabric_keys.h"

#include <sys/random.h>

namespace fuselink::fabric {
absl::StatusOr<SessionKey> RandomKey() {
  SessionKey k;
  if (getrandom(k.data(), k.size(), 0) != static_cast<ssize_t>(k.size()))
    return absl::InternalError("getrandom");
  return k;
}
SessionKey FabricKeys::AcceptKey(absl::string_view peer) {
  absl::MutexLock l(&mu_);
  auto it = accept_.find(peer);
  if (it != accept_.end()) return it->second;
  SessionKey k = *RandomKey();
  accept_.emplace(std::string(peer), k);
  return k;
}
std::optional<SessionKey> FabricKeys::FindAcceptKey(absl::string_view peer) const {
  absl::MutexLock l(&mu_);
  auto it = accept_.find(peer);
  if (it == accept_.end()) return std::nullopt;
  return it->second;
}
void FabricKeys::SetConnectKey(absl::string_view peer, const SessionKey& key) {
  absl::MutexLock l(&mu_);
  connect_[std::string(peer)] = key;
}
std::optional<SessionKey> FabricKeys::FindConnectKey(absl::string_view peer) const {
  absl::MutexLock l(&mu_);
  auto it = connect_.find(peer);
  if (it == connect_.end()) return std::nullopt;
  return it->second;
}
void FabricKeys::Forget(absl::string_view peer) {
  absl::MutexLock l(&mu_);
  if (auto it = accept_.find(peer); it != accept_.end()) accept_.erase(it);
  if (auto it = connect_.find(peer); it != connect_.end()) connect_.erase(it);
}
}  // namespace fuselink::fabric
