// What the landing says of itself (the class: landing.h): how the slot of a
// transfer stands (Query, for GetIncoming), the idle-NIC mask told to sources
// (owner traffic and the foreign-traffic watch's busy mask), the bytes the open
// slots can still take, the sources with open slots, and its stats.
#include <algorithm>

#include "agent/common/status_macros.h"
#include "agent/transfer/landing.h"

namespace fuselink::transfer {

uint32_t Landing::OwnerIdleMaskLocked() const {
  uint32_t mask = 0;
  for (int k = 0; k < nic_count_; ++k) {
    if (owner_slots_[k] == 0) mask |= 1u << k;
  }
  return mask;
}

uint32_t Landing::IdleMaskLocked() const {
  return OwnerIdleMaskLocked() & ~foreign_busy_.load(std::memory_order_acquire);
}

void Landing::SetForeignBusy(uint32_t mask) {
  if (foreign_busy_.exchange(mask, std::memory_order_acq_rel) != mask) TellIdle();
}

uint32_t Landing::IdleMask() const {
  absl::MutexLock lock(&mu_);
  return IdleMaskLocked();
}

void Landing::TellIdle() {
  // Compute, compare and tell as one step: two callers each computing a mask, then
  // telling them in the other order, would leave sources holding the older one.
  absl::MutexLock tell(&tell_mu_);
  const uint32_t mask = IdleMask();
  if (told_mask_ != mask) {
    told_mask_ = mask;
    if (on_idle_) on_idle_(mask);
  }
}

uint64_t Landing::AdmissibleBytes() const {
  uint64_t bytes = 0;
  absl::MutexLock lock(&mu_);
  for (uint32_t i : live_) {
    const Slot& slot = slots_[i];
    if (!slot.local) {
      const uint64_t remaining =
          slot.expected_bytes - std::min(slot.expected_bytes, slot.landed.bytes());
      bytes += slot.in_flight_bytes == 0 ? remaining
                                         : std::min(remaining, slot.in_flight_bytes);
    }
  }
  return bytes;
}

std::vector<std::string> Landing::ActiveSources() const {
  std::vector<std::string> out;
  absl::MutexLock lock(&mu_);
  for (uint32_t i : live_) {
    const Slot& slot = slots_[i];
    if (slot.state == SlotState::kOpen && !slot.local &&
        std::find(out.begin(), out.end(), slot.source_node) == out.end()) {
      out.push_back(slot.source_node);
    }
  }
  return out;
}

LandingNicStats Landing::Stats(int nic) const {
  LandingNicStats s;
  s.own_bytes = nic_bytes_[nic].own.load(std::memory_order_relaxed);
  s.borrowed_bytes = nic_bytes_[nic].borrowed.load(std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  s.owner_busy = !(OwnerIdleMaskLocked() >> nic & 1);
  return s;
}

size_t Landing::active() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

absl::StatusOr<v1::IncomingState> Landing::Query(absl::string_view source_node,
                                                 absl::string_view transfer_id) const {
  absl::MutexLock lock(&mu_);
  auto it = by_transfer_.find(TransferKey(source_node, transfer_id));
  if (it != by_transfer_.end()) {
    const Slot& slot = slots_[it->second];
    if (slot.source_node == source_node && slot.transfer_id == transfer_id) {
      v1::IncomingState state;
      state.set_landed_bytes(slot.state == SlotState::kClosed ? slot.landed_bytes
                                                              : slot.landed.bytes());
      if (slot.state != SlotState::kClosed) {
        state.set_open(true);  // closing: the verdict is told once the window drains
      } else {
        state.set_code(static_cast<int>(slot.verdict.code()));
        state.set_reason(ReasonOf(slot.verdict));
        state.set_message(std::string(slot.verdict.message()));
      }
      return state;
    }
  }
  return WithReason(absl::NotFoundError("no incoming transfer by that id from that node"),
                    reasons::kUnknownTransfer);
}

void Landing::ReportStats(stats::Sink& sink) const {
  using stats::Kind;
  static constexpr stats::Family kReceived{"fuselink_nic_received_bytes_total",
                                           "Payload bytes that landed through the NIC.",
                                           Kind::kCounter};
  static constexpr stats::Family kReceiveOwnerBusy{
      "fuselink_nic_receive_owner_busy",
      "1 while an incoming transfer targets the NIC's owner GPU.", Kind::kGauge};
  static constexpr stats::Family kActive{
      "fuselink_incoming_transfers_active",
      "Incoming transfers with a slot reserved on this node.", Kind::kGauge};
  static constexpr stats::Family kStrayWrites{
      "fuselink_stray_writes_total",
      "Writes and notices that named no open incoming transfer of their source (late, "
      "stale or misdirected); none of their bytes counted.",
      Kind::kCounter};
  static constexpr stats::Family kShareRefusals{
      "fuselink_incoming_share_refusals_total",
      "PrepareIncoming calls refused because their source held its share of the "
      "incoming slots (RESOURCE_EXHAUSTED, SOURCE_SHARE).",
      Kind::kCounter};
  static constexpr stats::Family kScattered{
      "fuselink_incoming_scattered_writes_total",
      "Incoming transfers ended PROTOCOL because their source's writes left more "
      "disjoint landed ranges than a transfer of their blocks can.",
      Kind::kCounter};
  static constexpr stats::Family kUnstartedExpired{
      "fuselink_incoming_unstarted_expired_total",
      "Incoming transfers ended because their source sent nothing after it prepared "
      "them (the tensor's pin let go).",
      Kind::kCounter};
  const int nics = std::min(sink.nic_count(), nic_count_);
  for (int k = 0; k < nics; ++k) {
    const LandingNicStats s = Stats(k);
    sink.AddPerNic(kReceived, k, static_cast<double>(s.own_bytes), {{"traffic", "own"}});
    sink.AddPerNic(kReceived, k, static_cast<double>(s.borrowed_bytes),
                   {{"traffic", "borrowed"}});
    sink.AddPerNic(kReceiveOwnerBusy, k, s.owner_busy ? 1 : 0);
  }
  sink.Add(kActive, static_cast<double>(active()));
  sink.Add(kStrayWrites, static_cast<double>(stray_writes()));
  sink.Add(kShareRefusals, static_cast<double>(share_refusals()));
  sink.Add(kScattered, static_cast<double>(scattered_writes()));
  sink.Add(kUnstartedExpired, static_cast<double>(unstarted_expired()));
}

}  // namespace fuselink::transfer
