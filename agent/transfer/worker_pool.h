// A few threads for the calls that block — a peer's gRPC answer (PrepareIncoming,
// QueryVerdict), a GPU fence, a VMM allocation — so that none of them runs on a fabric
// thread or under a transfer's lock.
//
// Bound: callers post at most one task per job at a time (its prepare or its
// question) and one per relay slot or NIC (a release, a growth), so the queue never
// holds more than the engine's jobs and relay slots. Thread-safe.
#pragma once

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace fuselink::transfer {

class WorkerPool {
 public:
  using Task = absl::AnyInvocable<void() &&>;

  explicit WorkerPool(int threads);
  ~WorkerPool() { Stop(/*run_queued=*/false); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task`; false (the task is dropped, not run) once stopping.
  bool Post(Task task);
  // Takes no task after this; runs the queued ones first if `run_queued`, else drops
  // them (unrun); waits for the running ones and joins the threads. Idempotent.
  void Stop(bool run_queued);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool run_queued_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex join_mu_;  // one Stop joins; the others wait for it
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace fuselink::transfer
