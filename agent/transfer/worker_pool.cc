#include "agent/transfer/worker_pool.h"

namespace fuselink::transfer {

WorkerPool::WorkerPool(int threads) {
  absl::MutexLock lock(&join_mu_);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

bool WorkerPool::Post(Task task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  return true;
}

void WorkerPool::Stop(bool run_queued) {
  std::deque<Task> dropped;  // destroyed with no lock held: they may own jobs
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) run_queued_ = run_queued;
    stopping_ = true;
    if (!run_queued_) dropped.swap(tasks_);
  }
  absl::MutexLock lock(&join_mu_);
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void WorkerPool::Loop() {
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return stopping_ || !tasks_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty() || (stopping_ && !run_queued_)) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace fuselink::transfer
