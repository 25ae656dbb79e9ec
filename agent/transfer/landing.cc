#include "agent/transfer/landing.h"

#include <algorithm>
#include <optional>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/plan.h"

namespace fuselink::transfer {

Landing::Landing(memory::Registry* registry, int nic_count, WatchFn on_event,
                 CreditFn on_credit)
    : registry_(registry),
      nic_count_(nic_count),
      on_event_(std::move(on_event)),
      on_credit_(std::move(on_credit)) {
  absl::MutexLock lock(&mu_);
  slots_.resize(kMaxIncoming);
  for (uint32_t i = 0; i < kMaxIncoming; ++i) free_.push_back(kMaxIncoming - 1 - i);
}

uint32_t Landing::IdleMaskLocked() const {
  uint32_t mask = 0;
  for (size_t k = 0; k < owner_slots_.size(); ++k) {
    if (owner_slots_[k] == 0) mask |= 1u << k;
  }
  return mask;
}

uint32_t Landing::IdleMask() const {
  absl::MutexLock lock(&mu_);
  return IdleMaskLocked();
}

void Landing::TellCredit() {
  const uint32_t mask = IdleMask();
  if (told_mask_.exchange(mask) != mask && on_credit_) on_credit_(mask);
}

std::vector<std::string> Landing::ActiveSources() const {
  std::vector<std::string> out;
  absl::MutexLock lock(&mu_);
  for (const Slot& slot : slots_) {
    if (slot.active && std::find(out.begin(), out.end(), slot.source_node) == out.end()) {
      out.push_back(slot.source_node);
    }
  }
  return out;
}

LandingNicStats Landing::Stats(int nic) const {
  LandingNicStats s;
  s.own_bytes = nic_bytes_[nic].own.load(std::memory_order_relaxed);
  s.borrowed_bytes = nic_bytes_[nic].borrowed.load(std::memory_order_relaxed);
  s.owner_busy = !(IdleMask() >> nic & 1);
  return s;
}

absl::StatusOr<v1::PrepareIncomingResponse> Landing::Prepare(
    const v1::PrepareIncomingRequest& request) {
  FL_ASSIGN_OR_RETURN(memory::TensorLease tensor, registry_->Acquire(request.tensor()));
  const memory::Layout& layout = tensor.info().layout;
  FL_RETURN_IF_ERROR(ValidateBlocks(
      layout, {request.block_ids().data(), static_cast<size_t>(request.block_ids_size())},
      "target", true));
  FL_RETURN_IF_ERROR(ValidateLayers(layout, request.layer_begin(), request.layer_end()));
  if (request.block_bytes() != layout.block_bytes) {
    return WithReason(absl::InvalidArgumentError(
                          absl::StrCat("source blocks are ", request.block_bytes(),
                                       " bytes, target blocks ", layout.block_bytes)),
                      "BLOCK_SIZE_MISMATCH");
  }
  const uint64_t expected = layout.block_bytes * request.block_ids_size() *
                            (request.layer_end() - request.layer_begin());
  if (request.total_bytes() != expected) {
    return WithReason(
        absl::InvalidArgumentError(
            absl::StrCat("total_bytes ", request.total_bytes(), " should be ", expected)),
        "BAD_TOTAL");
  }
  if (request.source_nic() >= static_cast<uint32_t>(nic_count_)) {
    return WithReason(absl::InvalidArgumentError(
                          absl::StrCat("source_nic ", request.source_nic(),
                                       " is not one of the ", nic_count_, " rails")),
                      "BAD_SOURCE_NIC");
  }
  const int rail = static_cast<int>(request.source_nic());
  v1::PrepareIncomingResponse response;
  {
    absl::MutexLock lock(&mu_);
    if (free_.empty()) {
      return WithReason(
          absl::ResourceExhaustedError(absl::StrCat("the target already has ",
                                                    kMaxIncoming, " incoming transfers")),
          "TOO_MANY_INCOMING");
    }
    const uint32_t index = free_.back();
    free_.pop_back();
    Slot& slot = slots_[index];
    slot.generation = (slot.generation + 1) & ((1u << kImmGenerationBits) - 1);
    slot.active = true;
    slot.source_node = request.source_node();
    slot.transfer_id = request.transfer_id();
    slot.block_ids.assign(request.block_ids().begin(), request.block_ids().end());
    slot.layer_begin = request.layer_begin();
    slot.layer_end = request.layer_end();
    slot.expected_bytes = expected;
    slot.rail = rail;
    ++owner_slots_[rail];
    slot.landed_bytes = 0;
    slot.last_activity = absl::Now();

    response.set_region_key(tensor.region_key());
    v1::Layout* out = response.mutable_layout();
    out->set_layers(layout.layers);
    out->set_blocks_per_layer(layout.blocks_per_layer);
    out->set_block_bytes(layout.block_bytes);
    out->set_block_stride_bytes(layout.block_stride_bytes);
    out->set_layer_stride_bytes(layout.layer_stride_bytes);
    response.set_slot(SlotId{index, slot.generation}.Pack());
    response.set_idle_nic_mask(IdleMaskLocked());
    slot.tensor = std::move(tensor);
  }
  TellCredit();
  return response;
}

v1::WatchEvent Landing::CloseLocked(Slot& slot, const absl::Status& status) {
  v1::WatchEvent event;
  event.set_transfer_id(slot.transfer_id);
  event.set_source_node(slot.source_node);
  event.set_tensor(slot.tensor.info().name);
  *event.mutable_block_ids() = {slot.block_ids.begin(), slot.block_ids.end()};
  event.mutable_layers()->set_begin(slot.layer_begin);
  event.mutable_layers()->set_end(slot.layer_end);
  event.set_bytes(std::min(slot.landed_bytes, slot.expected_bytes));
  event.set_code(static_cast<int>(status.code()));
  event.set_message(std::string(status.message()));
  slot.active = false;
  --owner_slots_[slot.rail];
  slot.tensor = memory::TensorLease();
  slot.block_ids.clear();
  free_.push_back(static_cast<uint32_t>(&slot - slots_.data()));
  return event;
}

void Landing::OnArrival(const fabric::Arrival& arrival) {
  const SlotId id = ImmSlot(arrival.imm);
  std::optional<v1::WatchEvent> event;
  {
    absl::MutexLock lock(&mu_);
    Slot* slot = id.index < slots_.size() ? &slots_[id.index] : nullptr;
    if (slot == nullptr || !slot->active || slot->generation != id.generation ||
        (arrival.bytes > 0 && arrival.key != slot->tensor.region_key())) {
      stray_writes_.fetch_add(1);
      return;
    }
    slot->last_activity = absl::Now();
    switch (ImmOpOf(arrival.imm)) {
      case ImmOp::kData: {
        // A chunk the source re-sent after a NIC failed may land twice: counted twice,
        // written twice with the same bytes.
        slot->landed_bytes += arrival.bytes;
        auto& counter = arrival.nic == slot->rail ? nic_bytes_[arrival.nic].own
                                                  : nic_bytes_[arrival.nic].borrowed;
        counter.fetch_add(arrival.bytes, std::memory_order_relaxed);
        break;
      }
      case ImmOp::kCommit:
        event = CloseLocked(
            *slot, slot->landed_bytes >= slot->expected_bytes
                       ? absl::OkStatus()
                       : WithReason(absl::DataLossError("the source committed before "
                                                        "every byte landed"),
                                    "INCOMPLETE_COMMIT"));
        break;
      case ImmOp::kAbort:
        event = CloseLocked(*slot, WithReason(absl::AbortedError("the source stopped "
                                                                 "the transfer"),
                                              "SOURCE_ABORTED"));
        break;
      default:
        stray_writes_.fetch_add(1);
    }
  }
  if (event) {
    on_event_(*event);
    TellCredit();
  }
}

void Landing::OnPeerLost(absl::string_view peer_name, const absl::Status& why) {
  absl::InlinedVector<v1::WatchEvent, 4> events;
  {
    absl::MutexLock lock(&mu_);
    for (Slot& slot : slots_) {
      if (slot.active && slot.source_node == peer_name) {
        events.push_back(CloseLocked(
            slot,
            WithReason(absl::UnavailableError(absl::StrCat(
                           "lost the source node '", peer_name, "': ", why.message())),
                       "PEER_LOST")));
      }
    }
  }
  for (const auto& e : events) on_event_(e);
  if (!events.empty()) TellCredit();
}

void Landing::AbortTensor(uint64_t tensor_id, const absl::Status& why) {
  absl::InlinedVector<v1::WatchEvent, 4> events;
  {
    absl::MutexLock lock(&mu_);
    for (Slot& slot : slots_) {
      if (slot.active && slot.tensor.valid() && slot.tensor.id() == tensor_id) {
        events.push_back(CloseLocked(slot, why));
      }
    }
  }
  for (const auto& e : events) on_event_(e);
  if (!events.empty()) TellCredit();
}

void Landing::Expire(absl::Time now) {
  absl::InlinedVector<v1::WatchEvent, 4> events;
  {
    absl::MutexLock lock(&mu_);
    for (Slot& slot : slots_) {
      if (slot.active && now - slot.last_activity > kIncomingIdleTimeout) {
        events.push_back(CloseLocked(
            slot, WithReason(absl::UnavailableError("no data from the source for 30 s"),
                             "SOURCE_IDLE")));
      }
    }
  }
  for (const auto& e : events) on_event_(e);
  if (!events.empty()) TellCredit();
}

size_t Landing::active() const {
  absl::MutexLock lock(&mu_);
  return kMaxIncoming - free_.size();
}

}  // namespace fuselink::transfer
