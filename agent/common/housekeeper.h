// Periodic work, each task run on one thread when it is due: a timer over a handful of
// named tasks in place of a loop per task that sleeps and polls a stop flag. A task
// returns how long until it runs again, so its period may follow load (the foreign-
// traffic watch looks less often while nothing moves). RunSoon brings a task forward
// (a failure that wants a repair now, not at the next tick); Stop wakes the thread at
// once, however long the next wait.
//
// Tasks run one after another in due order, never two at once. A Housekeeper made with
// `never_blocks` runs its tasks under ThreadRole::kHousekeeping, so that code that may
// block (FL_MAY_BLOCK) trips in a debug build: one slow task delays all the others.
// Thread-safe; Add before Start.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace fuselink {

class Housekeeper {
 public:
  using TaskId = int;
  // Runs the task's work; returns the delay until its next run.
  using Task = std::function<absl::Duration()>;

  // `name` names its thread (NameThisThread); `never_blocks` as above.
  Housekeeper(std::string name, bool never_blocks);
  ~Housekeeper();  // Stop
  Housekeeper(const Housekeeper&) = delete;
  Housekeeper& operator=(const Housekeeper&) = delete;

  // A task first run `first_delay` after Start. Before Start only.
  TaskId Add(std::string name, absl::Duration first_delay, Task task);
  void Start();
  // Runs `id` as soon as the thread is free, if it was due later. Never blocks.
  void RunSoon(TaskId id);
  // Ends the thread after the task that runs now, if any, and joins it. Idempotent;
  // not from a task.
  void Stop();

  // Runs of `id` so far (tests).
  uint64_t runs(TaskId id) const;

 private:
  struct Entry {
    std::string name;
    Task task;
    absl::Duration first_delay;
    absl::Time due = absl::InfiniteFuture();
    uint64_t runs = 0;
  };
  void Loop();
  // The earliest due task, or -1 with none.
  TaskId Earliest() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string name_;
  const bool never_blocks_;
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;  // a due time moved earlier
  std::thread thread_;
};

}  // namespace fuselink
