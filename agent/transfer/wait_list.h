// Jobs that could not post (no NIC free for them, a full NIC queue, no relay slot) and
// wait until something is freed: a completion, a relay slot, an idle-NIC notice, Kick.
//
// No wakeup is lost. A job takes a ticket *before* it tries the resources it needs;
// if it must wait, Enlist lists it only when no Kick came since the ticket, and
// otherwise answers false: the job tries again at once. A Kick bumps the epoch before
// it looks at the list, and Enlist counts the job before it compares the epoch, so one
// of the two always sees the other (both in one sequentially consistent order).
//
// Bound: a job is listed at most once (the job's own flag), so at most one entry per
// job the engine holds. Thread-safe; a leaf lock (taken under a transfer's lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace fuselink::transfer {

template <typename T>
class WaitList {
 public:
  using Ticket = uint64_t;

  Ticket ticket() const { return epoch_.load(std::memory_order_seq_cst); }

  // Lists `job` unless a Kick came since `ticket`; false: try again now.
  bool Enlist(std::shared_ptr<T> job, Ticket ticket) {
    absl::MutexLock lock(&mu_);
    count_.fetch_add(1, std::memory_order_seq_cst);
    if (epoch_.load(std::memory_order_seq_cst) != ticket) {
      count_.fetch_sub(1, std::memory_order_seq_cst);
      return false;
    }
    jobs_.push_back(std::move(job));
    return true;
  }

  // Takes every listed job (the caller lets each try again). Cheap when none waits.
  std::vector<std::shared_ptr<T>> Kick() {
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    std::vector<std::shared_ptr<T>> out;
    if (count_.load(std::memory_order_seq_cst) == 0) return out;
    absl::MutexLock lock(&mu_);
    out.swap(jobs_);
    count_.fetch_sub(out.size(), std::memory_order_seq_cst);
    return out;
  }

  size_t size() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> epoch_{0};
  std::atomic<size_t> count_{0};  // listed, or being listed under mu_
  absl::Mutex mu_;
  std::vector<std::shared_ptr<T>> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fuselink::transfer
