// File descriptors passed over the handle socket, waiting to be named by a
// RegisterTensor call. Thread-safe.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/unique_fd.h"

namespace fuselink::memory {

// Bound on descriptors waiting at once; past it, Put is RESOURCE_EXHAUSTED.
inline constexpr size_t kMaxPendingFds = 1024;
// How long a token stays valid.
inline constexpr absl::Duration kFdTokenLifetime = absl::Seconds(60);

class FdTokens {
 public:
  // Keeps `fd` and returns a fresh random token for it.
  absl::StatusOr<uint64_t> Put(UniqueFd fd);
  // Hands over the descriptor; the token is spent. INVALID_ARGUMENT (reason
  // BAD_FD_TOKEN) when unknown or expired.
  absl::StatusOr<UniqueFd> Take(uint64_t token);

 private:
  struct Entry {
    UniqueFd fd;
    absl::Time expires;
  };
  void DropExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fuselink::memory
