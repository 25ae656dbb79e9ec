#include "agent/sched/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/options.h"
#include "agent/common/status_macros.h"

namespace fuselink::sched {

absl::StatusOr<Policy> ParsePolicy(absl::string_view name) {
  if (name == "static") return Policy::kStatic;
  if (name == "stripe") return Policy::kStripe;
  if (name == "fuselink") return Policy::kFuselink;
  return WithReason(
      absl::InvalidArgumentError(
          absl::StrCat("unknown policy '", name, "'; choose fuselink, static or stripe")),
      reasons::kUnknownPolicy);
}

absl::string_view PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kStatic:
      return "static";
    case Policy::kStripe:
      return "stripe";
    case Policy::kFuselink:
      return "fuselink";
  }
  return "?";
}

absl::Status Limits::Validate() const {
  FL_RETURN_IF_ERROR(InRange("direct_depth", direct_depth, 1u, kMaxDepth));
  return InRange("borrow_depth", borrow_depth, 0u, kMaxDepth);
}

Scheduler::Scheduler(Policy policy, int nics, Limits limits)
    : policy_(policy), nics_(nics), limits_(limits) {}

bool Scheduler::Reserve(std::atomic<uint32_t>& counter, uint32_t bound,
                        uint32_t* before) {
  uint32_t now = counter.load(std::memory_order_relaxed);
  while (now < bound) {
    if (counter.compare_exchange_weak(now, now + 1, std::memory_order_acq_rel)) {
      if (before != nullptr) *before = now;
      return true;
    }
  }
  return false;
}

Choice Scheduler::Pick(int direct, uint32_t remote_idle, uint32_t usable,
                       uint32_t remaining, uint32_t own_direct) {
  usable &= (1u << nics_) - 1;
  if (!(usable >> direct & 1) || policy_ == Policy::kStripe) {
    // Stripe, or a failover away from a dead direct NIC: any usable NIC will do.
    Choice c = PickLeastLoaded(usable);
    if (!c.ok()) return c;
    c.borrowed = c.nic != direct;
    if (c.borrowed) {
      nic_[c.nic].borrowed_in_flight.fetch_add(1, std::memory_order_relaxed);
    } else {
      nic_[direct].owner_activity.fetch_add(1, std::memory_order_relaxed);
    }
    return c;
  }
  if (policy_ == Policy::kStatic) return TakeDirect(direct);
  return PickFuselink(direct, remote_idle, usable, remaining, own_direct);
}

Choice Scheduler::TakeDirect(int direct) {
  nic_[direct].in_flight.fetch_add(1, std::memory_order_relaxed);
  nic_[direct].owner_activity.fetch_add(1, std::memory_order_relaxed);
  return Choice{direct, false};
}

Choice Scheduler::PickLeastLoaded(uint32_t usable) {
  const uint32_t start = rotate_.fetch_add(1, std::memory_order_relaxed) % nics_;
  int best = -1;
  uint32_t best_load = UINT32_MAX;
  for (int i = 0; i < nics_; ++i) {
    const int k = static_cast<int>((start + i) % nics_);
    if (!(usable >> k & 1)) continue;
    const uint32_t load = nic_[k].in_flight.load(std::memory_order_relaxed);
    if (load < best_load) best = k, best_load = load;
  }
  if (best < 0) return Choice{};
  nic_[best].in_flight.fetch_add(1, std::memory_order_relaxed);
  return Choice{best, false};
}

Choice Scheduler::PickFuselink(int direct, uint32_t remote_idle, uint32_t usable,
                               uint32_t remaining, uint32_t own_direct) {
  if (picks_.fetch_add(1, std::memory_order_relaxed) % kStatusEvery == kStatusEvery - 1) {
    Look();
  }
  Nic& own = nic_[direct];
  // The direct NIC's depth for this transfer: its even share of what is left beside
  // the NICs it may borrow now. Under borrow_depth in flight the share cannot matter.
  uint32_t depth = limits_.direct_depth;
  const uint32_t floor = std::min(limits_.borrow_depth, depth);
  if (remaining != kManyChunks &&
      own.in_flight.load(std::memory_order_relaxed) >= floor) {
    const uint32_t lendable = remote_idle & usable & IdleMask() & ~(1u << direct);
    if (lendable != 0) {
      const uint32_t nics = 1 + static_cast<uint32_t>(__builtin_popcount(lendable));
      depth = std::clamp(remaining / nics + (remaining % nics != 0), floor, depth);
    }
  }
  if (Reserve(own.in_flight, depth, nullptr)) {
    own.owner_activity.fetch_add(1, std::memory_order_relaxed);
    return Choice{direct, false};
  }
  // The direct NIC is full: borrow the least loaded idle NIC, idle on both ends.
  const uint32_t start = rotate_.fetch_add(1, std::memory_order_relaxed) % nics_;
  int best = -1;
  uint32_t best_load = UINT32_MAX;
  for (int i = 0; i < nics_; ++i) {
    const int k = static_cast<int>((start + i) % nics_);
    const Nic& n = nic_[k];
    if (k == direct || !((remote_idle & usable) >> k & 1) || !Lendable(k) ||
        n.borrowed_in_flight.load(std::memory_order_relaxed) >= limits_.borrow_depth) {
      continue;
    }
    const uint32_t load = n.in_flight.load(std::memory_order_relaxed);
    if (load < best_load) best = k, best_load = load;
  }
  // Nothing to borrow: wait for the direct NIC, unless this transfer has nothing
  // there to wait for (its siblings fill the queue).
  const auto wait = [&] {
    return own_direct == 0 && limits_.direct_depth > 0 ? TakeDirect(direct) : Choice{};
  };
  if (best < 0) return wait();
  Nic& lent = nic_[best];
  uint32_t before = 0;
  if (!Reserve(lent.borrowed_in_flight, limits_.borrow_depth, &before)) return wait();
  // The owner (or foreign traffic) may have come since the scan: take the
  // reservation back.
  if (!Lendable(best)) {
    lent.borrowed_in_flight.fetch_sub(1, std::memory_order_acq_rel);
    return wait();
  }
  lent.in_flight.fetch_add(1, std::memory_order_relaxed);
  if (before == 0) lent.borrow_events.fetch_add(1, std::memory_order_relaxed);
  return Choice{best, true};
}

int64_t Scheduler::Complete(Choice choice, uint64_t bytes, bool failed) {
  Nic& n = nic_[choice.nic];
  n.in_flight.fetch_sub(1, std::memory_order_relaxed);
  if (failed) n.failed_chunks.fetch_add(1, std::memory_order_relaxed);
  if (!choice.borrowed) {
    n.own_bytes.fetch_add(bytes, std::memory_order_relaxed);
    n.owner_activity.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  n.borrowed_bytes.fetch_add(bytes, std::memory_order_relaxed);
  if (n.borrowed_in_flight.fetch_sub(1, std::memory_order_acq_rel) != 1) return 0;
  const int64_t since = n.give_back_since_ns.exchange(0, std::memory_order_acq_rel);
  return since == 0 ? 0 : std::max<int64_t>(1, absl::GetCurrentTimeNanos() - since);
}

bool Scheduler::Lendable(int k) const {
  return !nic_[k].busy.load(std::memory_order_acquire) &&
         !(foreign_busy_.load(std::memory_order_acquire) >> k & 1);
}

void Scheduler::BeginGiveBack(Nic& n) {
  if (n.borrowed_in_flight.load(std::memory_order_acquire) == 0) return;
  n.give_back_events.fetch_add(1, std::memory_order_relaxed);
  int64_t none = 0;
  n.give_back_since_ns.compare_exchange_strong(none, absl::GetCurrentTimeNanos());
}

void Scheduler::SetBusy(int k, bool busy) {
  Nic& n = nic_[k];
  const bool was = n.busy.exchange(busy, std::memory_order_acq_rel);
  // A NIC foreign-busy already gave back (SetForeignBusy): its owner's return is the
  // same give-back, not a second one.
  if (busy && !was && !(foreign_busy_.load(std::memory_order_acquire) >> k & 1)) {
    BeginGiveBack(n);
  }
}

void Scheduler::SetForeignBusy(uint32_t mask) {
  mask &= (1u << nics_) - 1;
  const uint32_t was = foreign_busy_.exchange(mask, std::memory_order_acq_rel);
  for (int k = 0; k < nics_; ++k) {
    // A NIC whose owner is busy already gave back; foreign traffic adds nothing.
    if ((mask & ~was) >> k & 1 && !nic_[k].busy.load(std::memory_order_acquire)) {
      BeginGiveBack(nic_[k]);
    }
  }
}

void Scheduler::OwnerStarted(int nic) {
  nic_[nic].owner_transfers.fetch_add(1, std::memory_order_acq_rel);
  SetBusy(nic, true);  // give back now, not at the next look
}

void Scheduler::OwnerStopped(int nic) {
  nic_[nic].owner_transfers.fetch_sub(1, std::memory_order_acq_rel);
}

void Scheduler::Look() {
  for (int k = 0; k < nics_; ++k) {
    Nic& n = nic_[k];
    const uint64_t activity = n.owner_activity.load(std::memory_order_relaxed);
    const uint64_t seen = n.activity_seen.exchange(activity, std::memory_order_relaxed);
    SetBusy(k, n.owner_transfers.load(std::memory_order_acquire) > 0 || activity != seen);
  }
}

void Scheduler::SampleIdle(int64_t elapsed_ns, bool waited) {
  if (!waited || elapsed_ns <= 0) return;
  const uint32_t foreign = foreign_busy_.load(std::memory_order_acquire);
  for (int k = 0; k < nics_; ++k) {
    Nic& n = nic_[k];
    if (foreign >> k & 1 || n.in_flight.load(std::memory_order_relaxed) != 0) continue;
    n.idle_while_demand_ns.fetch_add(static_cast<uint64_t>(elapsed_ns),
                                     std::memory_order_relaxed);
  }
}

uint32_t Scheduler::IdleMask() const {
  uint32_t mask = 0;
  for (int k = 0; k < nics_; ++k) {
    if (Lendable(k)) mask |= 1u << k;
  }
  return mask;
}

NicStats Scheduler::Stats(int nic) const {
  const Nic& n = nic_[nic];
  NicStats s;
  s.owner_busy = n.busy.load(std::memory_order_relaxed);
  s.in_flight = n.in_flight.load(std::memory_order_relaxed);
  s.borrowed_in_flight = n.borrowed_in_flight.load(std::memory_order_relaxed);
  s.own_bytes = n.own_bytes.load(std::memory_order_relaxed);
  s.borrowed_bytes = n.borrowed_bytes.load(std::memory_order_relaxed);
  s.borrow_events = n.borrow_events.load(std::memory_order_relaxed);
  s.give_back_events = n.give_back_events.load(std::memory_order_relaxed);
  s.failed_chunks = n.failed_chunks.load(std::memory_order_relaxed);
  s.idle_while_demand_ns = n.idle_while_demand_ns.load(std::memory_order_relaxed);
  return s;
}

void Scheduler::ReportStats(stats::Sink& sink) const {
  using stats::Kind;
  // Own traffic: chunks of the NIC's owner GPU; borrowed: chunks other GPUs sent
  // through it.
  static constexpr stats::Family kTransmitted{
      "fuselink_nic_transmitted_bytes_total",
      "Payload bytes sent through the NIC and acknowledged by the target.",
      Kind::kCounter};
  static constexpr stats::Family kOwnerBusy{
      "fuselink_nic_owner_busy",
      "1 while the NIC's owner GPU has traffic of its own on this node.", Kind::kGauge};
  static constexpr stats::Family kBorrowedInFlight{
      "fuselink_nic_borrowed_chunks_in_flight",
      "Chunks of other GPUs in flight on the NIC.", Kind::kGauge};
  static constexpr stats::Family kBorrowEvents{
      "fuselink_nic_borrow_events_total",
      "Times other GPUs began borrowing the idle NIC.", Kind::kCounter};
  static constexpr stats::Family kGiveBackEvents{
      "fuselink_nic_give_back_events_total",
      "Times the owner returned while its NIC was lent.", Kind::kCounter};
  static constexpr stats::Family kIdleWhileDemand{
      "fuselink_nic_idle_while_demand_seconds_total",
      "Time the NIC had nothing in flight while a transfer of this node waited to place "
      "a chunk (sampled every 5 ms).",
      Kind::kCounter};
  static constexpr stats::Family kFailedWrites{
      "fuselink_nic_failed_writes_total",
      "Writes that failed on the NIC; their chunks went again on others.",
      Kind::kCounter};
  const int nics = std::min(sink.nic_count(), nics_);
  for (int k = 0; k < nics; ++k) {
    const NicStats s = Stats(k);  // one snapshot per NIC and scrape
    sink.AddPerNic(kTransmitted, k, static_cast<double>(s.own_bytes),
                   {{"traffic", "own"}});
    sink.AddPerNic(kTransmitted, k, static_cast<double>(s.borrowed_bytes),
                   {{"traffic", "borrowed"}});
    sink.AddPerNic(kOwnerBusy, k, s.owner_busy ? 1 : 0);
    sink.AddPerNic(kBorrowedInFlight, k, static_cast<double>(s.borrowed_in_flight));
    sink.AddPerNic(kBorrowEvents, k, static_cast<double>(s.borrow_events));
    sink.AddPerNic(kGiveBackEvents, k, static_cast<double>(s.give_back_events));
    sink.AddPerNic(kIdleWhileDemand, k,
                   static_cast<double>(s.idle_while_demand_ns) / 1e9);
    sink.AddPerNic(kFailedWrites, k, static_cast<double>(s.failed_chunks));
  }
}

}  // namespace fuselink::sched
