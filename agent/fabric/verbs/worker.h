// A thread of the verbs fabric for steps that may take a while and must run neither
// on the caller's thread (CloseWindow never blocks) nor on a CQ poller (which must
// never wait on a slow verbs call or a GPU copy): deregistering a closed window's
// registrations, resetting a QP after a refusal, sending a QUERY; per NIC, landing
// staged arrivals. One thread, FIFO. (A NIC's deferred writes have a sender of their
// own, queued per peer: verbs/staged_sender.h.)
//
// Bound: the queue is not capped here because every producer is: at most one close
// per open window (kMaxWindows), one renewal per QP (kMaxQpsPerNic per NIC),
// kMaxPendingQueries per control link, and one landing per staged write in flight
// into an open window; a task is a few words.
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

  // `name`: its thread's (NameThisThread).
  explicit Worker(const char* name);
  // Stop().
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Queues `task`; it runs on the worker's thread after every task queued before it.
  // Once the thread has stopped, runs it on the caller's thread instead (teardown).
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
  const char* const name_;
  std::thread thread_;
};

}  // namespace fuselink::fabric::verbs
