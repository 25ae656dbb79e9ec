#include "agent/node/watch_hub.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::services {

struct WatchHub::Watcher {
  WatchSink* sink = nullptr;
  std::string identity;  // holds one of its share
  std::string tensor;    // filter; empty: all
  bool outgoing = false;
  std::deque<v1::WatchEvent> queue;
  v1::WatchEvent writing_event;
  bool writing = false;
  bool finished = false;
  bool cancelled = false;
  bool overflowed = false;
};

WatchHub::WatchHub(size_t max_per_identity) : max_per_identity_(max_per_identity) {}
WatchHub::~WatchHub() = default;

absl::Status WatchHub::Add(WatchSink* sink, std::string identity, std::string tensor,
                           bool outgoing, Watcher** handle) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    size_t& held = held_[identity];
    if (held >= max_per_identity_) {
      ++share_refusals_;
      return WithReason(
          absl::ResourceExhaustedError(absl::StrCat(
              identity.empty() ? std::string("every caller (open access)")
                               : absl::StrCat("'", BoundedForMessage(identity), "'"),
              " already holds ", held,
              " watch streams, its share (--max_watches_per_identity); end one first")),
          reasons::kWatchShare);
    }
    ++held;
    watchers_.push_back(std::make_unique<Watcher>());
    Watcher* w = watchers_.back().get();
    w->sink = sink;
    w->identity = std::move(identity);
    w->tensor = std::move(tensor);
    w->outgoing = outgoing;
    *handle = w;
    Advance(w, &actions);
  }
  Run(actions);
  return absl::OkStatus();
}

void WatchHub::OnWriteDone(Watcher* w, bool ok) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    w->writing = false;
    if (!ok) w->cancelled = true;
    Advance(w, &actions);
  }
  Run(actions);
}

void WatchHub::OnCancel(Watcher* w) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    w->cancelled = true;
    Advance(w, &actions);
  }
  Run(actions);
}

void WatchHub::Remove(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  auto held = held_.find(watcher->identity);
  if (--held->second == 0) held_.erase(held);
  std::erase_if(watchers_, [watcher](const auto& w) { return w.get() == watcher; });
}

void WatchHub::Publish(const v1::WatchEvent& event) {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    for (auto& w : watchers_) {
      if (w->finished || w->outgoing != event.outgoing() ||
          (!w->tensor.empty() && w->tensor != event.tensor())) {
        continue;
      }
      if (w->queue.size() >= kMaxQueuedWatchEvents) {
        w->overflowed = true;
      } else {
        w->queue.push_back(event);
      }
      Advance(w.get(), &actions);
    }
  }
  Run(actions);
}

void WatchHub::Close() {
  Actions actions;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (auto& w : watchers_) Advance(w.get(), &actions);
  }
  Run(actions);
}

size_t WatchHub::size() const {
  absl::MutexLock lock(&mu_);
  return watchers_.size();
}

uint64_t WatchHub::share_refusals() const {
  absl::MutexLock lock(&mu_);
  return share_refusals_;
}

void WatchHub::Advance(Watcher* w, Actions* actions) {
  if (w->writing || w->finished) return;
  if (w->cancelled || w->overflowed) {
    w->finished = true;
    absl::Status why =
        w->overflowed ? WithReason(absl::ResourceExhaustedError(
                                       "the watcher fell too far behind; watch again"),
                                   reasons::kWatcherTooSlow)
                      : absl::CancelledError("watch ended");
    actions->push_back(Action{w->sink, nullptr, std::move(why)});
    return;
  }
  if (w->queue.empty()) {
    // The agent is stopping: every event published so far has been written.
    if (closed_) {
      w->finished = true;
      actions->push_back(
          Action{w->sink, nullptr,
                 WithReason(absl::UnavailableError("the agent is shutting down"),
                            reasons::kShuttingDown)});
    }
    return;
  }
  w->writing_event = std::move(w->queue.front());
  w->queue.pop_front();
  w->writing = true;
  actions->push_back(Action{w->sink, &w->writing_event, absl::OkStatus()});
}

void WatchHub::Run(const Actions& actions) {
  for (const Action& a : actions) {
    if (a.event != nullptr) {
      a.sink->SendEvent(a.event);
    } else {
      a.sink->End(a.status);
    }
  }
}

void WatchHub::ReportStats(stats::Sink& sink) const {
  sink.Add(stats::kShareRefusals, {{"reason", "WATCH_SHARE"}},
           static_cast<double>(share_refusals()));
}

}  // namespace fuselink::services
