#include "agent/memory/fd_tokens.h"

#include <sys/random.h>

#include <cerrno>

#include "absl/container/flat_hash_map.h"
#include "agent/common/status_macros.h"

namespace fuselink::memory {
namespace {

// Eight bytes from the kernel's CSPRNG. getrandom(2) does not return short for
// requests of up to 256 bytes once the pool is initialized, nor fail with EINTR;
// any other outcome is an error.
absl::StatusOr<uint64_t> RandomWord() {
  uint64_t word = 0;
  const ssize_t got = getrandom(&word, sizeof(word), 0);
  if (got != static_cast<ssize_t>(sizeof(word))) {
    return ErrnoStatus("getrandom(fd token)", got < 0 ? errno : EIO);
  }
  return word;
}

}  // namespace

absl::StatusOr<uint64_t> FdTokens::Put(UniqueFd fd, Lender lender) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  DropExpiredLocked(now);
  if (pending_.size() >= kMaxPendingFds) {
    return WithReason(absl::ResourceExhaustedError("too many file descriptors waiting "
                                                   "for RegisterTensor"),
                      reasons::kTooManyPendingFds);
  }
  uint64_t token = 0;
  // A zero or a collision is one chance in 2^54 at kMaxPendingFds: the loop is
  // bounded in practice, and each turn asks the kernel again.
  do {
    FL_ASSIGN_OR_RETURN(token, RandomWord());
  } while (token == 0 || pending_.contains(token));
  pending_.emplace(token, Entry{std::move(fd), lender, now + kFdTokenLifetime});
  return token;
}

absl::StatusOr<LentFd> FdTokens::Take(uint64_t token) {
  absl::MutexLock lock(&mu_);
  DropExpiredLocked(absl::Now());
  auto it = pending_.find(token);
  if (it == pending_.end()) {
    return WithReason(absl::InvalidArgumentError(
                          "fd_token is unknown, used or expired: pass the memfd over "
                          "the handle socket first"),
                      reasons::kBadFdToken);
  }
  LentFd out{std::move(it->second.fd), it->second.lender};
  pending_.erase(it);
  return out;
}

void FdTokens::DropExpiredLocked(absl::Time now) {
  absl::erase_if(pending_, [now](const auto& kv) { return kv.second.expires <= now; });
}

}  // namespace fuselink::memory
