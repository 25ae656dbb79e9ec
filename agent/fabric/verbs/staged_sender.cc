#include "agent/fabric/verbs/staged_sender.h"

#include <utility>

#include "agent/common/check.h"

namespace fuselink::fabric::verbs {

StagedSender::StagedSender(const char* name, uint32_t slots, uint32_t slots_per_peer)
    : slots_(slots),
      slots_per_peer_(slots_per_peer),
      name_(name),
      thread_(&StagedSender::Loop, this) {
  FL_CHECK(slots_per_peer >= 1 && slots_per_peer <= slots,
           "a peer's share of the bounce slots is 1..slots");
}

StagedSender::~StagedSender() {
  Stop();
  absl::MutexLock lock(&mu_);
  FL_CHECK(claimed_ == 0, "a bounce slot's claim outlived its sender");
}

void StagedSender::Queue(PeerId peer, std::unique_ptr<Write> write) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) {
      // A lane that waits keeps waiting: the new write is behind its first.
      lanes_[peer].writes.push_back(std::move(write));
      return;
    }
  }
  write->Abandon(absl::UnavailableError("the NIC's sender of deferred writes stopped"));
}

std::shared_ptr<const void> StagedSender::TryClaimSlot(PeerId peer) {
  absl::MutexLock lock(&mu_);
  auto held = held_.find(peer);
  if (held != held_.end() && held->second >= slots_per_peer_) {
    auto lane = lanes_.find(peer);
    if (lane != lanes_.end() && !lane->second.share_counted) {
      lane->second.share_counted = true;
      ++share_waits_;
    }
    return nullptr;
  }
  if (claimed_ >= slots_) return nullptr;
  ++held_[peer];
  ++claimed_;
  return std::shared_ptr<const void>(this,
                                     [this, peer](const void*) { ReturnSlot(peer); });
}

void StagedSender::ReturnSlot(PeerId peer) {
  absl::MutexLock lock(&mu_);
  auto held = held_.find(peer);
  FL_CHECK(held != held_.end() && claimed_ > 0, "a bounce slot's claim went back twice");
  if (--held->second == 0) held_.erase(held);
  --claimed_;
  ++returns_;
  // Any lane may go on now: its own share has room, or a slot is free again.
  for (auto& [id, lane] : lanes_) {
    if (lane.wait == Wait::kSlot) lane.wait = Wait::kNone;
  }
}

void StagedSender::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, lane] : lanes_) lane.wait = Wait::kNone;  // one more try each
  }
  if (thread_.joinable()) thread_.join();
}

uint32_t StagedSender::slots_held(PeerId peer) const {
  absl::MutexLock lock(&mu_);
  auto held = held_.find(peer);
  return held == held_.end() ? 0 : held->second;
}

uint64_t StagedSender::share_waits() const {
  absl::MutexLock lock(&mu_);
  return share_waits_;
}

void StagedSender::Loop() {
  NameThisThread(name_);
  while (std::optional<Turn> turn = NextTurn()) {
    if (!Settle(*turn, turn->write->Try())) {
      turn->write->Abandon(
          absl::UnavailableError("the NIC's sender of deferred writes stopped"));
      Settle(*turn, Step{.outcome = Outcome::kDone});
    }
    // A write that ended dies here, unlocked: letting go of its slot takes the lock.
  }
}

std::optional<StagedSender::Turn> StagedSender::NextTurn() {
  absl::MutexLock lock(&mu_);
  while (true) {
    const absl::Time now = absl::Now();
    for (auto& [id, lane] : lanes_) {
      if (lane.wait == Wait::kUntil && lane.until <= now) lane.wait = Wait::kNone;
    }
    if (auto lane = NextLane(); lane != lanes_.end()) {
      last_served_ = lane->first;
      Turn turn{.peer = lane->first,
                .write = std::move(lane->second.writes.front()),
                .returns_seen = returns_};
      lane->second.writes.pop_front();
      return turn;
    }
    if (stopping_) {  // every lane is tried while stopping: none is left
      FL_DCHECK(lanes_.empty(), "a deferred write left behind at stop");
      stopped_ = true;
      return std::nullopt;
    }
    mu_.AwaitWithDeadline(absl::Condition(this, &StagedSender::HasTurn), EarliestRetry());
  }
}

bool StagedSender::Settle(Turn& turn, const Step& step) {
  absl::MutexLock lock(&mu_);
  auto found = lanes_.find(turn.peer);
  FL_CHECK(found != lanes_.end(), "a lane went while its first write was out");
  Lane& lane = found->second;
  if (step.outcome == Outcome::kDone) {
    lane.share_counted = false;
    if (lane.writes.empty()) lanes_.erase(found);
    return true;
  }
  if (stopping_) return false;
  lane.writes.push_front(std::move(turn.write));
  if (step.outcome == Outcome::kRetry) {
    lane.wait = Wait::kUntil;
    lane.until = step.retry_at;
  } else if (returns_ == turn.returns_seen) {  // else a slot came back meanwhile
    lane.wait = Wait::kSlot;
  }
  return true;
}

std::map<PeerId, StagedSender::Lane>::iterator StagedSender::NextLane() {
  auto ready = [](const Lane& lane) { return lane.wait == Wait::kNone; };
  for (auto it = lanes_.upper_bound(last_served_); it != lanes_.end(); ++it) {
    if (ready(it->second)) return it;
  }
  for (auto it = lanes_.begin(); it != lanes_.end() && it->first <= last_served_; ++it) {
    if (ready(it->second)) return it;
  }
  return lanes_.end();
}

absl::Time StagedSender::EarliestRetry() const {
  absl::Time earliest = absl::InfiniteFuture();
  for (const auto& [id, lane] : lanes_) {
    if (lane.wait == Wait::kUntil && lane.until < earliest) earliest = lane.until;
  }
  return earliest;
}

bool StagedSender::HasTurn() const {
  if (stopping_) return true;
  for (const auto& [id, lane] : lanes_) {
    if (lane.wait == Wait::kNone) return true;
  }
  return false;
}

}  // namespace fuselink::fabric::verbs
