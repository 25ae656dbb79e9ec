// Threads for the calls that block — a peer's gRPC answer (PrepareIncoming,
// QueryVerdict), a GPU fence, a VMM allocation, a registration's mapping — so that
// none of them runs on a fabric thread, a gRPC thread or under a transfer's lock.
//
//  - WorkerPool: a few threads, one FIFO. Bound: callers post at most one task per
//    job at a time and one per relay slot or NIC (a release, a growth), so its queue
//    never holds more than the engine's jobs and relay slots.
//  - KeyedPool: a few threads shared by keys (a target node, a calling peer), each
//    key a lane of its own: at most `running_per_key` of a key's tasks run at once,
//    so a key whose calls hang holds that many threads and no more, and the others
//    go on; a key's tasks start in the order posted. Its queue is bounded per key and
//    in all; a post past either bound is refused (RESOURCE_EXHAUSTED), not queued.
//    Its threads start with the first post: a pool nobody posts to costs nothing.
//
// Both thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/errors.h"

namespace fuselink::transfer {

// Threads of any one pool, at most.
inline constexpr int kMaxPoolThreads = 256;

class WorkerPool {
 public:
  using Task = absl::AnyInvocable<void() &&>;

  // `thread_name`: its threads' (NameThisThread).
  WorkerPool(int threads, const char* thread_name);
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
  const char* const thread_name_;
  absl::Mutex join_mu_;  // one Stop joins; the others wait for it
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(join_mu_);
};

struct KeyedPoolOptions {
  // What the pool runs, for messages ("prepares of target").
  std::string name = "tasks of";
  // Its threads' name (NameThisThread): "fl-" and at most 12 characters.
  const char* thread_name = "fl-pool";
  // The reason a refused post carries.
  Reason reason = reasons::kQueueFull;
  // Threads, shared by all keys; 1 to kMaxPoolThreads.
  int threads = 2;
  // Tasks of one key that run at once; 1 (a serial lane) to `threads`.
  int running_per_key = 1;
  // Tasks of one key queued or running; at least 1. Under `running_per_key` it bounds
  // the key's running tasks too.
  size_t pending_per_key = 16;
  // Tasks of all keys queued or running; at least `pending_per_key`.
  size_t pending_total = 256;

  // INVALID_ARGUMENT naming the first field out of its range above (common/options.h).
  absl::Status Validate() const;
};

class KeyedPool {
 public:
  using Task = absl::AnyInvocable<void() &&>;

  // `options` must validate; out of range is a programmer's error (FL_CHECK_OK).
  explicit KeyedPool(KeyedPoolOptions options);
  ~KeyedPool() { Stop(/*run_queued=*/false); }
  KeyedPool(const KeyedPool&) = delete;
  KeyedPool& operator=(const KeyedPool&) = delete;

  // Queues `task` in `key`'s lane. RESOURCE_EXHAUSTED (options' reason) when `key`
  // has pending_per_key tasks queued or running, or the pool pending_total (counted
  // in refused()); UNAVAILABLE (SHUTTING_DOWN) once stopping. A refused task is
  // dropped unrun, here, on the caller's thread. Never blocks.
  absl::Status Post(absl::string_view key, Task task);
  // As WorkerPool::Stop.
  void Stop(bool run_queued);

  // Posts refused for a bound, since the start.
  uint64_t refused() const;
  // Tasks queued or running now.
  size_t pending() const;
  const KeyedPoolOptions& options() const { return options_; }

 private:
  struct Lane {
    std::deque<Task> tasks;
    int running = 0;
    bool listed = false;  // in ready_
  };
  void Loop();
  // Lists `key`'s lane in ready_ if it has a task that may start.
  void MaybeList(const std::string& key, Lane& lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KeyedPoolOptions options_;
  mutable absl::Mutex mu_;
  // Lanes with a task queued or running; at most pending_total of them.
  absl::flat_hash_map<std::string, Lane> lanes_ ABSL_GUARDED_BY(mu_);
  // Keys whose next task may start, in turn (round robin over keys).
  std::deque<std::string> ready_ ABSL_GUARDED_BY(mu_);
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool run_queued_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // threads start with the first post
  // One Stop joins; the others wait for it. Taken after mu_ where both are held.
  absl::Mutex join_mu_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace fuselink::transfer
