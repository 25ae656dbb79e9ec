#include "agent/transfer/worker_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "agent/common/options.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/admission.h"

namespace fuselink::transfer {

WorkerPool::WorkerPool(int threads, const char* thread_name) : thread_name_(thread_name) {
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
  FL_MAY_BLOCK();            // joins the threads
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
  NameThisThread(thread_name_);
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

// --- KeyedPool ---

absl::Status KeyedPoolOptions::Validate() const {
  FL_RETURN_IF_ERROR(InRange("threads", threads, 1, kMaxPoolThreads));
  FL_RETURN_IF_ERROR(InRange("running_per_key", running_per_key, 1, threads));
  FL_RETURN_IF_ERROR(AtLeast<size_t>("pending_per_key", pending_per_key, 1));
  return AtLeast("pending_total", pending_total, pending_per_key);
}

KeyedPool::KeyedPool(KeyedPoolOptions options) : options_(std::move(options)) {
  FL_CHECK_OK(options_.Validate());
}

absl::Status KeyedPool::Post(absl::string_view key, Task task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return ShuttingDownStatus();
  std::string over;  // the bound the post would pass, if any
  auto it = lanes_.find(key);
  if (pending_ >= options_.pending_total) {
    over = absl::StrCat(options_.pending_total,
                        " queued or running over all keys, the most in all");
  } else if (it != lanes_.end() &&
             it->second.tasks.size() + it->second.running >= options_.pending_per_key) {
    over = absl::StrCat(options_.pending_per_key, " queued or running, the most for one");
  }
  if (!over.empty()) {
    ++refused_;
    return WithReason(absl::ResourceExhaustedError(
                          absl::StrCat(options_.name, " '", BoundedForMessage(key),
                                       "': ", over, "; try again later")),
                      options_.reason);
  }
  if (it == lanes_.end()) it = lanes_.try_emplace(std::string(key)).first;
  it->second.tasks.push_back(std::move(task));
  ++pending_;
  MaybeList(it->first, it->second);
  if (!started_) {  // a pool nobody posts to holds no threads (TCP's prepares)
    started_ = true;
    absl::MutexLock join_lock(&join_mu_);
    for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  return absl::OkStatus();
}

void KeyedPool::MaybeList(const std::string& key, Lane& lane) {
  if (lane.listed || lane.tasks.empty() || lane.running >= options_.running_per_key) {
    return;
  }
  lane.listed = true;
  ready_.push_back(key);
}

void KeyedPool::Stop(bool run_queued) {
  FL_MAY_BLOCK();                                  // joins the threads
  absl::flat_hash_map<std::string, Lane> dropped;  // destroyed with no lock held
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) run_queued_ = run_queued;
    stopping_ = true;
    if (!run_queued_) {
      for (auto& [key, lane] : lanes_) {
        pending_ -= lane.tasks.size();
        dropped[key].tasks.swap(lane.tasks);
      }
      ready_.clear();
    }
  }
  absl::MutexLock lock(&join_mu_);
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

uint64_t KeyedPool::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

size_t KeyedPool::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_;
}

void KeyedPool::Loop() {
  NameThisThread(options_.thread_name);
  for (;;) {
    Task task;
    std::string key;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return !ready_.empty() || (stopping_ && (!run_queued_ || pending_ == 0));
      };
      mu_.Await(absl::Condition(&ready));
      if (ready_.empty()) return;  // stopping, and nothing more to run here
      key = std::move(ready_.front());
      ready_.pop_front();
      Lane& lane = lanes_.at(key);
      lane.listed = false;
      task = std::move(lane.tasks.front());
      lane.tasks.pop_front();
      ++lane.running;
      FL_DCHECK(lane.running <= options_.running_per_key,
                "a key runs more tasks at once than its share");
      MaybeList(key, lane);  // behind the other keys: they take turns
    }
    std::move(task)();
    task = nullptr;  // what it owned goes before the lane is told it ended
    absl::MutexLock lock(&mu_);
    --pending_;
    auto it = lanes_.find(key);
    Lane& lane = it->second;
    --lane.running;
    if (lane.running == 0 && lane.tasks.empty()) {
      lanes_.erase(it);
    } else {
      MaybeList(key, lane);
    }
  }
}

}  // namespace fuselink::transfer
