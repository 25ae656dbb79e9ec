#include "agent/memory/fd_tokens.h"

#include <random>

#include "absl/container/flat_hash_map.h"
#include "agent/common/status_macros.h"

namespace fuselink::memory {

absl::StatusOr<uint64_t> FdTokens::Put(UniqueFd fd) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  DropExpiredLocked(now);
  if (pending_.size() >= kMaxPendingFds) {
    return WithReason(absl::ResourceExhaustedError("too many file descriptors waiting "
                                                   "for RegisterTensor"),
                      "TOO_MANY_PENDING_FDS");
  }
  uint64_t token = 0;
  do {
    token = rng();
  } while (token == 0 || pending_.contains(token));
  pending_.emplace(token, Entry{std::move(fd), now + kFdTokenLifetime});
  return token;
}

absl::StatusOr<UniqueFd> FdTokens::Take(uint64_t token) {
  absl::MutexLock lock(&mu_);
  DropExpiredLocked(absl::Now());
  auto it = pending_.find(token);
  if (it == pending_.end()) {
    return WithReason(absl::InvalidArgumentError(
                          "fd_token is unknown, used or expired: pass the memfd over "
                          "the handle socket first"),
                      "BAD_FD_TOKEN");
  }
  UniqueFd fd = std::move(it->second.fd);
  pending_.erase(it);
  return fd;
}

void FdTokens::DropExpiredLocked(absl::Time now) {
  absl::erase_if(pending_, [now](const auto& kv) { return kv.second.expires <= now; });
}

}  // namespace fuselink::memory
