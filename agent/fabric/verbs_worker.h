// The verbs fabric's thread for control-plane steps that may take a while and must
// run neither on the caller's thread (CloseWindow never blocks) nor on a CQ poller
// (which must never wait on a slow verbs call): deregistering a closed window's
// registrations, resetting a QP after a refusal, sending a QUERY. One thread, FIFO.
//
// Bound: the queue is not capped here because every producer is: at most one close
// per open window (kMaxWindows), one renewal per QP (kMaxQpsPerNic per NIC), and
// kMaxPendingQueries per control link; a task is a few words.
#pragma once

#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace fuselink::fabric::verbs {

class Worker {
 public:
  using Task = absl::AnyInvocable<void() &&>;

  Worker();
  // Stop().
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Queues `task`; it runs on the worker's thread after every task queued before it.
  // Once Stop() has begun, runs it on the caller's thread instead (teardown).
  void Run(Task task);
  // Runs every task already queued (and any they queue), then joins. Idempotent; not
  // from a task.
  void Stop();

 private:
  void Loop();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !tasks_.empty();
  }

  absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // the thread is gone
  std::thread thread_;
};

}  // namespace fuselink::fabric::verbs
