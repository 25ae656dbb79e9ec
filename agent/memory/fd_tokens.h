// File descriptors passed over the handle socket, waiting to be named by a
// RegisterTensor call, each with the credentials of the process that passed it.
// Thread-safe.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/unique_fd.h"
#include "agent/memory/lender.h"

namespace fuselink::memory {

// Bound on descriptors waiting at once; past it, Put is RESOURCE_EXHAUSTED.
inline constexpr size_t kMaxPendingFds = 1024;
// How long a token stays valid.
inline constexpr absl::Duration kFdTokenLifetime = absl::Seconds(60);

// A descriptor handed back by Take, with who passed it.
struct LentFd {
  UniqueFd fd;
  Lender lender;
};

class FdTokens {
 public:
  // Keeps `fd`, passed by `lender`, and returns a fresh token for it: 64 bits from
  // the kernel's CSPRNG (getrandom), never 0, so that a token cannot be guessed from
  // others (gRPC callers redeem it without any other proof). getrandom's errno as a
  // status if the kernel gives no random bytes.
  absl::StatusOr<uint64_t> Put(UniqueFd fd, Lender lender);
  // Hands over the descriptor and its lender; the token is spent. INVALID_ARGUMENT
  // (reason BAD_FD_TOKEN) when unknown or expired.
  absl::StatusOr<LentFd> Take(uint64_t token);

 private:
  struct Entry {
    UniqueFd fd;
    Lender lender;
    absl::Time expires;
  };
  void DropExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fuselink::memory
