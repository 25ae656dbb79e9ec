// The events that move an open incoming slot (the class: landing.h): its source's
// writes and notices (OnArrival: data counted as it lands, commit, abort), and the
// ends that come from outside it: its peer lost, its tensor aborted, a silent
// source or a waiting commit expired, the agent shutting down. Each begins the
// slot's end under mu_ and drains its windows once mu_ is let go (landing.cc).
#include <algorithm>

#include "agent/common/check.h"
#include "agent/fabric/window_table.h"
#include "agent/transfer/landing.h"

namespace fuselink::transfer {

std::optional<Landing::Ending> Landing::OnDataLocked(const fabric::Arrival& arrival,
                                                     Slot& slot) {
  const uint32_t index = static_cast<uint32_t>(&slot - slots_.data());
  const auto region = std::find(slot.windows.begin(), slot.windows.end(), arrival.window);
  const uint64_t offset = memory::TensorOffset(
      static_cast<uint32_t>(region - slot.windows.begin()), arrival.offset);
  if (arrival.window == 0 || region == slot.windows.end() ||
      !fabric::InsideExtents(slot.blocks, offset, arrival.bytes)) {
    // The window admitted it, so the bytes are inside one of this source's own
    // windows; naming another of its slots in the immediate breaks the protocol.
    stray_writes_.fetch_add(1);
    return BeginCloseLocked(index, TargetStatus(Verdict::kProtocol));
  }
  slot.landed.Add(offset, arrival.bytes);
  FL_EXPECT(slot.landed.bytes() <= slot.expected_bytes,
            "a slot counted more bytes than its blocks hold");
  auto& counter = slot.local                 ? local_bytes_
                  : arrival.nic == slot.rail ? nic_bytes_[arrival.nic].own
                                             : nic_bytes_[arrival.nic].borrowed;
  counter.fetch_add(arrival.bytes, std::memory_order_relaxed);
  if (slot.landed.ranges() > slot.max_landed_ranges) {
    scattered_writes_.fetch_add(1, std::memory_order_relaxed);
    return BeginCloseLocked(index, TargetStatus(Verdict::kProtocol));
  }
  if (slot.commit_deadline != absl::InfiniteFuture() &&
      slot.landed.bytes() == slot.expected_bytes) {
    return BeginCloseLocked(index, absl::OkStatus());  // the commit was waiting for us
  }
  return std::nullopt;
}

void Landing::OnArrival(const fabric::Arrival& arrival) {
  const SlotId id = ImmSlot(arrival.imm);
  const ImmOp op = ImmOpOf(arrival.imm);
  std::optional<Ending> ending;
  std::optional<std::pair<std::string, uint32_t>> resend;
  {
    absl::MutexLock lock(&mu_);
    Slot& slot = slots_[id.index];  // the index has kImmSlotBits: always in the table
    const bool from_source =
        arrival.peer_name.empty() || arrival.peer_name == slot.source_node;
    if (slot.generation != id.generation || !from_source ||
        (op != ImmOp::kData && op != ImmOp::kCommit && op != ImmOp::kAbort) ||
        (op == ImmOp::kData) != (arrival.bytes > 0)) {
      stray_writes_.fetch_add(1);
      return;
    }
    if (slot.state != SlotState::kOpen) {
      // A late or repeated write or notice for a slot that has ended: nothing more
      // counts. A repeated commit means the source missed the verdict: say it again.
      if (op != ImmOp::kData && slot.state == SlotState::kClosed) {
        resend.emplace(slot.source_node,
                       EncodeVerdict(id, static_cast<uint8_t>(VerdictOf(slot.verdict))));
      } else if (op == ImmOp::kData) {
        stray_writes_.fetch_add(1);
      }
    } else {
      slot.last_activity = absl::Now();
      slot.started = true;
      switch (op) {
        case ImmOp::kData:
          ending = OnDataLocked(arrival, slot);
          break;
        case ImmOp::kCommit:
          if (slot.landed.bytes() == slot.expected_bytes) {
            ending = BeginCloseLocked(id.index, absl::OkStatus());
          } else if (slot.commit_deadline == absl::InfiniteFuture()) {
            slot.commit_deadline = absl::Now() + options_.commit_grace;
          }
          break;
        default:  // kAbort
          ending = BeginCloseLocked(id.index, TargetStatus(Verdict::kSourceAborted));
      }
    }
  }
  if (resend && on_notice_) on_notice_(resend->first, resend->second);
  if (ending) Drain(*ending);
}

void Landing::OnPeerLost(absl::string_view peer_name) {
  std::vector<Ending> endings;
  {
    absl::MutexLock lock(&mu_);
    for (uint32_t i : live_) {
      if (slots_[i].state == SlotState::kOpen && slots_[i].source_node == peer_name) {
        endings.push_back(BeginCloseLocked(i, TargetStatus(Verdict::kPeerLost)));
      }
    }
  }
  DrainAll(endings);
}

void Landing::AbortTensor(uint64_t tensor_id, const absl::Status& why) {
  std::vector<Ending> endings;
  {
    absl::MutexLock lock(&mu_);
    for (uint32_t i : live_) {
      Slot& slot = slots_[i];
      if (slot.state == SlotState::kOpen && slot.tensor.id() == tensor_id) {
        endings.push_back(BeginCloseLocked(i, why));
      }
    }
  }
  DrainAll(endings);
}

void Landing::Expire(absl::Time now) {
  std::vector<Ending> endings;
  {
    absl::MutexLock lock(&mu_);
    for (uint32_t i : live_) {
      Slot& slot = slots_[i];
      if (slot.state != SlotState::kOpen) continue;
      if (now > slot.commit_deadline) {
        endings.push_back(BeginCloseLocked(i, TargetStatus(Verdict::kIncompleteCommit)));
      } else if (!slot.started && now - slot.last_activity > options_.start_timeout) {
        unstarted_expired_.fetch_add(1, std::memory_order_relaxed);
        endings.push_back(BeginCloseLocked(i, TargetStatus(Verdict::kSourceIdle)));
      } else if (now - slot.last_activity > options_.idle_timeout) {
        endings.push_back(BeginCloseLocked(i, TargetStatus(Verdict::kSourceIdle)));
      }
    }
  }
  DrainAll(endings);
}

void Landing::Shutdown() {
  std::vector<Ending> endings;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (uint32_t i : live_) {
      if (slots_[i].state == SlotState::kOpen) {
        endings.push_back(BeginCloseLocked(i, TargetStatus(Verdict::kShuttingDown)));
      }
    }
  }
  DrainAll(endings);
}

}  // namespace fuselink::transfer
