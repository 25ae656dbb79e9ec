#include "agent/fabric/verbs/worker.h"

#include <utility>

#include "agent/common/check.h"

namespace fuselink::fabric::verbs {

Worker::Worker(const char* name) : name_(name), thread_(&Worker::Loop, this) {}

Worker::~Worker() { Stop(); }

void Worker::Run(Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) {
      tasks_.push_back(std::move(task));
      return;
    }
  }
  std::move(task)();
}

void Worker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Worker::Loop() {
  NameThisThread(name_);
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Worker::HasWork));
      if (tasks_.empty()) {  // stopping, and nothing is left
        stopped_ = true;
        return;
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace fuselink::fabric::verbs
