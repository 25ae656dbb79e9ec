#include "agent/common/housekeeper.h"

#include <utility>

#include "absl/time/clock.h"
#include "agent/common/check.h"

namespace fuselink {

Housekeeper::Housekeeper(std::string name, bool never_blocks)
    : name_(std::move(name)), never_blocks_(never_blocks) {}

Housekeeper::~Housekeeper() { Stop(); }

Housekeeper::TaskId Housekeeper::Add(std::string name, absl::Duration first_delay,
                                     Task task) {
  absl::MutexLock lock(&mu_);
  FL_CHECK(!started_, "a task added to a running housekeeper");
  entries_.push_back(Entry{std::move(name), std::move(task), first_delay});
  return static_cast<TaskId>(entries_.size() - 1);
}

void Housekeeper::Start() {
  {
    absl::MutexLock lock(&mu_);
    FL_CHECK(!started_, "a housekeeper started twice");
    started_ = true;
    const absl::Time now = absl::Now();
    for (Entry& e : entries_) e.due = now + e.first_delay;
  }
  thread_ = std::thread([this] { Loop(); });
}

void Housekeeper::RunSoon(TaskId id) {
  absl::MutexLock lock(&mu_);
  FL_CHECK(id >= 0 && static_cast<size_t>(id) < entries_.size(), "no such task");
  if (!started_) return;  // Start runs it at its first delay
  const absl::Time now = absl::Now();
  if (entries_[id].due <= now) return;
  entries_[id].due = now;
  woken_ = true;
}

void Housekeeper::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t Housekeeper::runs(TaskId id) const {
  absl::MutexLock lock(&mu_);
  return entries_.at(id).runs;
}

Housekeeper::TaskId Housekeeper::Earliest() const {
  TaskId earliest = -1;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (earliest < 0 || entries_[i].due < entries_[earliest].due) {
      earliest = static_cast<TaskId>(i);
    }
  }
  return earliest;
}

void Housekeeper::Loop() {
  NameThisThread(name_.c_str());
  if (never_blocks_) SetThreadRole(ThreadRole::kHousekeeping);
  auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_ || woken_; };
  for (;;) {
    const Task* task = nullptr;
    TaskId id = -1;
    {
      absl::MutexLock lock(&mu_);
      for (;;) {
        if (stopped_) return;
        id = Earliest();
        woken_ = false;
        const absl::Time due = id < 0 ? absl::InfiniteFuture() : entries_[id].due;
        if (!mu_.AwaitWithDeadline(absl::Condition(&woken), due)) break;  // due
      }
      entries_[id].due = absl::InfiniteFuture();  // running
      // entries_ keeps its shape once started: the task stays where it is.
      task = &entries_[id].task;
    }
    const absl::Duration next = (*task)();
    absl::MutexLock lock(&mu_);
    ++entries_[id].runs;
    // A RunSoon during the run brought it forward: that stands.
    if (entries_[id].due == absl::InfiniteFuture()) entries_[id].due = absl::Now() + next;
  }
}

}  // namespace fuselink
