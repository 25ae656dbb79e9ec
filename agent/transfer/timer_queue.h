// One timer per job, earliest first: the job's deadline, its wait for a verdict, its
// next question to the target, or a retry. Setting, moving and taking a timer are
// O(log n) in the jobs that have one; nothing walks the jobs that have none, and
// nothing wakes while no timer is due. Thread-safe; a leaf lock (set under a
// transfer's lock, so that a job's timers are set in the order it decided them).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace fuselink::transfer {

template <typename T>
class TimerQueue {
 public:
  // Sets the one timer of `key` to `when`; InfiniteFuture clears it.
  void Set(uint32_t key, const std::shared_ptr<T>& value, absl::Time when) {
    absl::MutexLock lock(&mu_);
    if (auto it = timers_.find(key); it != timers_.end()) {
      order_.erase({it->second.first, key});
      timers_.erase(it);
    }
    if (when == absl::InfiniteFuture()) return;
    if (order_.empty() || when < order_.begin()->first) earlier_ = true;
    order_.insert({when, key});
    timers_.emplace(key, std::make_pair(when, value));
  }

  // Takes the timers due at `now`, earliest first.
  std::vector<std::shared_ptr<T>> TakeDue(absl::Time now) {
    std::vector<std::shared_ptr<T>> due;
    absl::MutexLock lock(&mu_);
    while (!order_.empty() && order_.begin()->first <= now) {
      const uint32_t key = order_.begin()->second;
      order_.erase(order_.begin());
      auto it = timers_.find(key);
      due.push_back(std::move(it->second.second));
      timers_.erase(it);
    }
    return due;
  }

  absl::Time next() const {
    absl::MutexLock lock(&mu_);
    return order_.empty() ? absl::InfiniteFuture() : order_.begin()->first;
  }

  // Blocks until the earliest timer or `until` is due, a timer earlier than the one
  // waited for is set, or Stop. False once stopped.
  bool Wait(absl::Time until) {
    absl::MutexLock lock(&mu_);
    const absl::Time first =
        order_.empty() ? until : std::min(until, order_.begin()->first);
    earlier_ = false;
    auto woken = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopped_ || earlier_; };
    mu_.AwaitWithDeadline(absl::Condition(&woken), first);
    return !stopped_;
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return timers_.size();
  }

 private:
  mutable absl::Mutex mu_;
  absl::btree_set<std::pair<absl::Time, uint32_t>> order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, std::pair<absl::Time, std::shared_ptr<T>>> timers_
      ABSL_GUARDED_BY(mu_);
  bool earlier_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace fuselink::transfer
