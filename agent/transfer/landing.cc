// A slot's life at the target (the class: landing.h): Prepare checks a transfer,
// opens its windows and reserves the slot; BeginCloseLocked, Drain and Finish end
// it and tell its verdict once its windows drained. What moves an open slot is in
// landing_events.cc; what the landing reports of itself, in landing_stats.cc.
#include "agent/transfer/landing.h"

#include <algorithm>
#include <limits>

#include "absl/container/inlined_vector.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "agent/common/limits.h"
#include "agent/common/options.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/layout_proto.h"
#include "agent/transfer/plan.h"
#include "agent/transfer/wr_id.h"

namespace fuselink::transfer {
namespace {

// Disjoint landed ranges a slot may hold over its block pieces (MaxLandedRanges)
// before its source is judged to break the protocol.
constexpr size_t kMaxRangesOverPieces = 4096;
// A hole inside a piece is a write still in flight or being sent again, at most one a
// window entry (window.h): a source's window never needs more.
static_assert(kMaxRangesOverPieces >= kMaxWindowChunks);

// The most disjoint landed ranges a legitimate source of a transfer of `pieces` block
// pieces (blocks x layers x the target's parts) can make the slot hold, in whatever
// order the request lists the blocks. A source writes each of its extents front to
// back, chunk by chunk, and a target piece's stretches in order (plan.h), so apart
// from the holes of writes in flight each piece holds at most one range: the
// landed bytes join into the pieces as they land, and pieces that touch join too.
// (The source writes in ascending target order within a layer, so in practice a slot
// holds a handful; a source that lists blocks out of order and writes them in that
// order stays within this too.) Merged runs (Slot::blocks) are no bound: with blocks
// evens-then-odds, or interleaved with layers, one run holds a range per block.
//
// Memory: a range is a btree entry of 16 bytes in nodes at least half full, under 32
// bytes (measured 19 in order, 23 at random), so a slot holds at most
// (kMaxBlockPieces + kMaxRangesOverPieces) x 32 bytes, about 64 MiB, whatever its
// source writes; a request that big makes Prepare spend 32 MiB on BlockRanges anyway.
// Merged runs never outnumber pieces, so this is no more than the bound on runs
// allowed before.
size_t MaxLandedRanges(uint64_t pieces) {
  return static_cast<size_t>(std::min<uint64_t>(pieces, kMaxBlockPieces)) +
         kMaxRangesOverPieces;
}

// Never 0 (what a target that draws none sends). absl's generator is seeded from the
// OS's entropy, so two starts of one node draw the same value once in 2^64.
uint64_t DrawIncarnation() {
  absl::BitGen gen;
  return absl::Uniform<uint64_t>(absl::IntervalClosed, gen, 1,
                                 std::numeric_limits<uint64_t>::max());
}

}  // namespace

absl::Status LandingOptions::Validate() const {
  FL_RETURN_IF_ERROR(InRange("idle_timeout", idle_timeout, kMinIdleTimeout,
                             absl::Milliseconds(kMaxTimeoutMs)));
  return InRange("max_per_source", max_per_source, 1u, kMaxIncoming);
}

Landing::Landing(memory::Registry* registry, fabric::Fabric* fabric, int nic_count,
                 WatchFn on_event, NoticeFn on_notice, IdleFn on_idle,
                 LandingOptions options)
    : registry_(registry),
      fabric_(fabric),
      nic_count_(nic_count),
      on_event_(std::move(on_event)),
      on_notice_(std::move(on_notice)),
      on_idle_(std::move(on_idle)),
      options_(options),
      incarnation_(DrawIncarnation()) {
  absl::MutexLock lock(&mu_);
  slots_.resize(kMaxIncoming);
  live_.reserve(kMaxIncoming);
  for (uint32_t i = 0; i < kMaxIncoming; ++i) free_.push_back(i);
}

Landing::~Landing() { Shutdown(); }

std::string Landing::TransferKey(absl::string_view source_node,
                                 absl::string_view transfer_id) {
  // Length-prefixed: two different pairs never make one key.
  return absl::StrCat(source_node.size(), ":", source_node, transfer_id);
}

absl::Status Landing::CheckRoomLocked(const std::string& source) {
  if (free_.empty()) {
    return WithReason(
        absl::ResourceExhaustedError(
            absl::StrCat("the target already has ", kMaxIncoming, " incoming transfers")),
        reasons::kTooManyIncoming);
  }
  if (auto it = per_source_.find(source);
      it != per_source_.end() && it->second >= options_.max_per_source) {
    share_refusals_.fetch_add(1, std::memory_order_relaxed);
    return WithReason(absl::ResourceExhaustedError(absl::StrCat(
                          "node '", BoundedForMessage(source), "' holds ", it->second,
                          " incoming slots here (open or draining), its share")),
                      reasons::kSourceShare);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PrepareIncomingResponse> Landing::Prepare(
    const v1::PrepareIncomingRequest& request,
    absl::FunctionRef<absl::Status(const memory::TensorInfo&)> may_write, Source from) {
  if (PrepareMayBlock()) FL_MAY_BLOCK();  // registrations, the fabric's handshake
  FL_ASSIGN_OR_RETURN(memory::TensorLease tensor, registry_->Acquire(request.tensor()));
  FL_RETURN_IF_ERROR(may_write(tensor.info()));
  const memory::Layout& layout = tensor.info().layout;
  const std::span<const uint32_t> ids(request.block_ids().data(),
                                      static_cast<size_t>(request.block_ids_size()));
  FL_RETURN_IF_ERROR(ValidateBlocks(layout, ids, "target", true));
  FL_RETURN_IF_ERROR(ValidateLayers(layout, request.layer_begin(), request.layer_end()));
  if (request.block_bytes() != layout.block_bytes) {
    return WithReason(absl::InvalidArgumentError(
                          absl::StrCat("source blocks are ", request.block_bytes(),
                                       " bytes, target blocks ", layout.block_bytes)),
                      reasons::kBlockSizeMismatch);
  }
  const uint64_t expected = layout.block_bytes * request.block_ids_size() *
                            (request.layer_end() - request.layer_begin());
  if (request.total_bytes() != expected) {
    return WithReason(
        absl::InvalidArgumentError(
            absl::StrCat("total_bytes ", request.total_bytes(), " should be ", expected)),
        reasons::kBadTotal);
  }
  if (request.source_nic() >= static_cast<uint32_t>(nic_count_)) {
    return WithReason(absl::InvalidArgumentError(
                          absl::StrCat("source_nic ", request.source_nic(),
                                       " is not one of the ", nic_count_, " rails")),
                      reasons::kBadSourceNic);
  }
  FL_ASSIGN_OR_RETURN(
      std::vector<fabric::Extent> blocks,
      BlockRanges(layout, ids, request.layer_begin(), request.layer_end()));
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) {
      return WithReason(absl::UnavailableError("the target agent is shutting down"),
                        reasons::kShuttingDown);
    }
    FL_RETURN_IF_ERROR(CheckRoomLocked(request.source_node()));
  }
  // The windows: these blocks, this source, nothing else; one per region written.
  absl::StatusOr<std::vector<fabric::WindowKey>> windows =
      OpenWindows(tensor, request.source_node(), blocks);
  if (!windows.ok()) {
    return WithReason(
        absl::UnavailableError(absl::StrCat("cannot open a window for the transfer: ",
                                            windows.status().message())),
        reasons::kWindowFailed);
  }
  const int rail = static_cast<int>(request.source_nic());
  v1::PrepareIncomingResponse response;
  absl::Status room = absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    room = shut_down_
               ? WithReason(absl::UnavailableError("the target agent is shutting down"),
                            reasons::kShuttingDown)
               : CheckRoomLocked(request.source_node());
    if (room.ok()) {
      const uint32_t index = OpenSlotLocked();
      Slot& slot = slots_[index];
      slot.source_node = request.source_node();
      slot.transfer_id = request.transfer_id();
      slot.tensor = std::move(tensor);
      slot.block_ids.assign(ids.begin(), ids.end());
      slot.layer_begin = request.layer_begin();
      slot.layer_end = request.layer_end();
      slot.rail = rail;
      slot.local = from == Source::kThisNode;
      slot.windows = *windows;
      slot.blocks = std::move(blocks);
      slot.expected_bytes = expected;
      slot.in_flight_bytes = request.in_flight_bytes();
      slot.landed = LandedRanges();
      slot.max_landed_ranges = MaxLandedRanges(
          uint64_t{ids.size()} * (request.layer_end() - request.layer_begin()) *
          layout.part_count());
      slot.last_activity = absl::Now();
      slot.started = false;
      slot.commit_deadline = absl::InfiniteFuture();
      slot.verdict = absl::OkStatus();
      by_transfer_[TransferKey(slot.source_node, slot.transfer_id)] = index;
      ++per_source_[slot.source_node];
      if (!slot.local) ++owner_slots_[rail];
      ++open_;

      *response.mutable_window_keys() = {windows->begin(), windows->end()};
      LayoutToProto(layout, response.mutable_layout());
      response.set_slot(SlotId{index, slot.generation}.Pack());
      response.set_idle_nic_mask(IdleMaskLocked());
      response.set_incarnation(incarnation_);
    }
  }
  if (!room.ok()) {  // lost the race for the last slot, or shut down meanwhile
    CloseWindows(*windows, [] {});
    return room;
  }
  TellIdle();
  return response;
}

uint32_t Landing::OpenSlotLocked() {
  const uint32_t index = free_.front();
  free_.pop_front();
  Slot& slot = slots_[index];
  if (!slot.transfer_id.empty()) {  // it forgets the transfer it remembered
    auto it = by_transfer_.find(TransferKey(slot.source_node, slot.transfer_id));
    if (it != by_transfer_.end() && it->second == index) by_transfer_.erase(it);
  }
  slot.generation = (slot.generation + 1) & ((1u << kImmGenerationBits) - 1);
  slot.state = SlotState::kOpen;
  slot.live_at = static_cast<uint32_t>(live_.size());
  live_.push_back(index);
  return index;
}

Landing::Ending Landing::BeginCloseLocked(uint32_t index, absl::Status verdict) {
  Slot& slot = slots_[index];
  FL_DCHECK(slot.state == SlotState::kOpen && open_ > 0, "a slot ended twice");
  FL_DCHECK(slot.local || owner_slots_[slot.rail] > 0, "a rail's slots miscounted");
  slot.state = SlotState::kClosing;
  slot.verdict = std::move(verdict);
  slot.commit_deadline = absl::InfiniteFuture();
  if (!slot.local) --owner_slots_[slot.rail];
  --open_;
  // The slot still counts in per_source_ until Finish: its window may still place.
  return Ending{index, slot.generation, slot.windows};
}

absl::StatusOr<std::vector<fabric::WindowKey>> Landing::OpenWindows(
    const memory::TensorLease& tensor, absl::string_view source,
    std::span<const fabric::Extent> blocks) {
  const std::vector<memory::Region>& regions = tensor.regions();
  std::vector<fabric::WindowKey> windows(regions.size(), 0);
  std::vector<fabric::Extent> in_region;
  for (size_t first = 0; first < blocks.size();) {  // blocks are sorted: by region
    const uint32_t region = memory::RegionOf(blocks[first].offset);
    in_region.clear();
    size_t last = first;
    for (; last < blocks.size() && memory::RegionOf(blocks[last].offset) == region;
         ++last) {
      in_region.push_back(
          {memory::OffsetInRegion(blocks[last].offset), blocks[last].bytes});
    }
    absl::StatusOr<fabric::WindowKey> key =
        fabric_->OpenWindow(regions[region].key, source, in_region);
    if (!key.ok()) {
      CloseWindows(windows, [] {});
      return key.status();
    }
    windows[region] = *key;
    first = last;
  }
  return windows;
}

void Landing::CloseWindows(const std::vector<fabric::WindowKey>& windows,
                           absl::AnyInvocable<void() &&> drained) {
  // `drained` runs once, after the last window drained.
  struct Countdown {
    Countdown(size_t n, absl::AnyInvocable<void() &&> then)
        : left(n), done(std::move(then)) {}
    std::atomic<size_t> left;
    absl::AnyInvocable<void() &&> done;
  };
  size_t open = 0;
  for (fabric::WindowKey w : windows) open += w != 0;
  if (open == 0) return std::move(drained)();
  auto countdown = std::make_shared<Countdown>(open, std::move(drained));
  for (fabric::WindowKey w : windows) {
    if (w == 0) continue;
    fabric_->CloseWindow(w, [countdown] {
      if (countdown->left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::move(countdown->done)();
      }
    });
  }
}

void Landing::Drain(const Ending& ending) {
  CloseWindows(ending.windows,
               [this, index = ending.index, generation = ending.generation] {
                 Finish(index, generation);
               });
}

void Landing::DrainAll(const std::vector<Ending>& endings) {
  for (const Ending& e : endings) Drain(e);
}

void Landing::Finish(uint32_t index, uint32_t generation) {
  v1::WatchEvent event;
  std::string source;
  uint32_t notice = 0;
  memory::TensorLease released;  // let go of outside the lock
  {
    absl::MutexLock lock(&mu_);
    Slot& slot = slots_[index];
    if (slot.state != SlotState::kClosing || slot.generation != generation) return;
    slot.state = SlotState::kClosed;
    // Out of live_: the last live slot takes its place.
    FL_DCHECK(live_[slot.live_at] == index, "a live slot out of its place");
    slots_[live_.back()].live_at = slot.live_at;
    live_[slot.live_at] = live_.back();
    live_.pop_back();
    // The target decides: completed only with every byte of every block landed.
    FL_EXPECT(!slot.verdict.ok() || slot.landed.bytes() == slot.expected_bytes,
              "a slot completed before every byte of its blocks landed");
    auto share = per_source_.find(slot.source_node);
    FL_EXPECT(share != per_source_.end(), "a closing slot its source's share missed");
    if (share != per_source_.end() && --share->second == 0) per_source_.erase(share);
    event.set_transfer_id(slot.transfer_id);
    event.set_source_node(slot.source_node);
    event.set_tensor(slot.tensor.info().name);
    *event.mutable_block_ids() = {slot.block_ids.begin(), slot.block_ids.end()};
    event.mutable_layers()->set_begin(slot.layer_begin);
    event.mutable_layers()->set_end(slot.layer_end);
    slot.landed_bytes = slot.landed.bytes();
    event.set_bytes(slot.landed_bytes);
    SetCoverage(slot.verdict.ok(), slot.tensor.info().layout, slot.block_ids,
                slot.block_ids, slot.layer_begin, slot.layer_end, slot.landed, &event);
    event.set_code(static_cast<int>(slot.verdict.code()));
    event.set_message(std::string(slot.verdict.message()));
    event.set_reason(ReasonOf(slot.verdict));
    source = slot.source_node;
    notice = EncodeVerdict(SlotId{index, generation},
                           static_cast<uint8_t>(VerdictOf(slot.verdict)));
    released = std::move(slot.tensor);
    slot.block_ids = {};
    slot.blocks = {};
    slot.landed = LandedRanges();
    free_.push_back(index);
  }
  // The target tensor is free before anyone hears the transfer ended: a watcher that
  // unregisters it on the event never finds it still pinned.
  released = memory::TensorLease();
  on_event_(event);
  if (on_notice_) on_notice_(source, notice);
  TellIdle();
}

}  // namespace fuselink::transfer
