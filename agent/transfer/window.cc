#include "agent/transfer/window.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/wr_id.h"

namespace fuselink::transfer {

Window::Window(WindowEnv env, uint32_t job, int direct_nic, SourceMemory source,
               const Prepared& target, std::vector<Extent> extents, uint32_t chunk_bytes,
               uint32_t window_chunks, NicReach* reach, absl::string_view target_node)
    : env_(env),
      job_(job),
      direct_nic_(direct_nic),
      source_(source),
      target_(target),
      extents_(std::move(extents)),
      cursor_(extents_, chunk_bytes),
      total_chunks_(CountChunks(extents_, chunk_bytes)),
      reach_(reach),
      target_node_(target_node),
      remote_idle_(target.idle_nic_mask),
      entries_(window_chunks) {
  free_.reserve(window_chunks);
  for (uint32_t i = 0; i < window_chunks; ++i) {
    free_.push_back(static_cast<uint16_t>(window_chunks - 1 - i));
  }
  again_.reserve(window_chunks + 1);  // one per entry, and the one being placed
}

bool Window::all_landed(const Transfer& transfer) const {
  return !halted_ && in_flight_ == 0 && parked_ < 0 && again_.empty() && cursor_.done() &&
         transfer.all_done_locked();
}

absl::Status Window::TakeTrouble() {
  trouble_ = Trouble::kNone;
  return std::exchange(trouble_status_, absl::OkStatus());
}

void Window::SetTrouble(Trouble trouble, absl::Status status) {
  if (trouble_ != Trouble::kNone) return;  // the first one stands
  trouble_ = trouble;
  trouble_status_ = std::move(status);
}

fabric::WriteOp Window::Op(uint16_t index) {
  Entry& e = entries_[index];
  fabric::WriteOp op;
  if (e.relay.valid()) {  // sent from the relay slot, once its copy is done
    op.local_key = e.relay.key;
    op.local_offset = e.relay.offset;
    op.after = e.relay.ready;
  } else {
    FL_CHECK(memory::RegionOf(e.chunk.source_offset) < source_.regions.size(),
             "a chunk read from no region of its source");
    op.local_key = source_.regions[memory::RegionOf(e.chunk.source_offset)].key;
    op.local_offset = memory::OffsetInRegion(e.chunk.source_offset);
  }
  // Planned from the target's layout, which names as many regions as it sent windows.
  FL_CHECK(memory::RegionOf(e.chunk.target_offset) < target_.windows.size(),
           "a chunk bound for no window of its target");
  op.remote_key = target_.windows[memory::RegionOf(e.chunk.target_offset)];
  op.remote_offset = memory::OffsetInRegion(e.chunk.target_offset);
  op.bytes = e.chunk.bytes;
  op.imm = EncodeImm(SlotId::Unpack(target_.slot), ImmOp::kData);
  op.wr_id = EncodeWrId(WrId{job_, index, ++e.seq});
  return op;
}

void Window::Pump(JobEffects* fx) {
  if (halted_) return;
  if (parked_ >= 0) {
    const auto index = static_cast<uint16_t>(parked_);
    parked_ = -1;
    if (!Send(index, fx)) return;
  }
  const bool relayed = source_.gpu >= 0 && env_.relay != nullptr;
  while (!halted_ && !free_.empty()) {
    Chunk chunk;
    if (!again_.empty()) {
      chunk = again_.back();
      again_.pop_back();
    } else if (cursor_.done() || cursor_.next_layer() >= ready_end_ ||
               !cursor_.Next(&chunk)) {
      return;  // all sent, or the next layer is not computed yet
    } else {
      ++taken_;
    }
    uint32_t usable = reach_->mask();
    // A relay GPU short of memory lends none of its NICs; the direct NIC needs none.
    if (relayed) usable &= env_.relay->borrowable() | (1u << direct_nic_);
    // Not landed yet: this chunk, those to retry, those the cursor still holds, and
    // those in flight.
    const uint64_t remaining = 1 + again_.size() + (total_chunks_ - taken_) + in_flight_;
    const sched::Choice choice =
        env_.scheduler->Pick(direct_nic_, remote_idle_, usable,
                             static_cast<uint32_t>(std::min<uint64_t>(
                                 remaining, sched::Scheduler::kManyChunks)),
                             direct_reserved_);
    if (!choice.ok()) {
      again_.push_back(chunk);
      fx->wait = true;
      return;
    }
    if (OnDirect(choice)) ++direct_reserved_;
    const uint16_t index = free_.back();
    free_.pop_back();
    Entry& e = entries_[index];
    e.chunk = chunk;
    e.choice = choice;
    e.relay = relay::Slot{};
    if (relayed && choice.borrowed) {
      // The relay stage: into a slot on the borrowed NIC's GPU, sent from there. The
      // copy is only enqueued; the write waits for its fence on the fabric's thread.
      e.relay = env_.relay->TryAcquire(choice.nic);
      if (!e.relay.valid()) {
        Unreserve(choice, 0);
        free_.push_back(index);
        again_.push_back(chunk);
        fx->grow_relay |= 1u << choice.nic;
        fx->wait = true;
        return;
      }
      const uint8_t* from = source_.regions[memory::RegionOf(chunk.source_offset)].base +
                            memory::OffsetInRegion(chunk.source_offset);
      const absl::Status staged =
          env_.relay->Stage(e.relay, relay::Source{from, source_.gpu}, chunk.bytes);
      if (!staged.ok()) {
        Drop(index, /*failed=*/false, fx);
        SetTrouble(Trouble::kFailed,
                   WithReason(absl::InternalError(absl::StrCat(
                                  "relay stage: ", staged.message().substr(0, 256))),
                              reasons::kRelayFailed));
        return Halt(fx);
      }
    }
    if (!Send(index, fx)) return;
  }
}

bool Window::Send(uint16_t index, JobEffects* fx) {
  Entry& e = entries_[index];
  FL_DCHECK(e.state != Entry::State::kInFlight, "a window entry posted twice");
  const absl::Status posted =
      env_.fabric->PostWrite(target_.peer, e.choice.nic, Op(index));
  switch (ClassifyPost(posted)) {
    case PostOutcome::kPosted:
      e.state = Entry::State::kInFlight;
      ++in_flight_;
      return true;
    case PostOutcome::kQueueFull:
      // Kept as it is, NIC and relay slot included, and posted first next time.
      e.state = Entry::State::kParked;
      parked_ = index;
      fx->wait = true;
      return false;
    case PostOutcome::kNicFault:
      LoseNic(index, posted, fx);
      return !halted_;
    case PostOutcome::kFailed:
      Drop(index, /*failed=*/true, fx);
      SetTrouble(Trouble::kFailed, posted);
      Halt(fx);
      return false;
  }
  return false;
}

void Window::Drop(uint16_t index, bool failed, JobEffects* fx) {
  Entry& e = entries_[index];
  Unreserve(e.choice, 0, failed);
  if (e.relay.valid()) {
    fx->release_after_fence.push_back(e.relay);
    e.relay = relay::Slot{};
  }
  e.state = Entry::State::kFree;
  free_.push_back(index);
  FL_DCHECK(free_.size() + in_flight_ <= entries_.size(), "a window entry freed twice");
}

int64_t Window::Unreserve(const sched::Choice& choice, uint64_t bytes, bool failed) {
  if (OnDirect(choice)) {
    FL_DCHECK(direct_reserved_ > 0, "a direct NIC's reservation ended twice");
    --direct_reserved_;
  }
  return env_.scheduler->Complete(choice, bytes, failed);
}

void Window::LoseNic(uint16_t index, const absl::Status& why, JobEffects* fx) {
  const Chunk chunk = entries_[index].chunk;
  const int nic = entries_[index].choice.nic;
  fx->NoteNicLost(why);
  Drop(index, /*failed=*/true, fx);
  if (halted_) return;
  again_.push_back(chunk);
  if (!reach_->Lose(nic)) {
    SetTrouble(Trouble::kPeerLost, PeerLostStatus(target_node_, why));
    Halt(fx);
  }
}

bool Window::OnCompletion(uint16_t entry, uint16_t seq,
                          const fabric::Completion& completion, Transfer& transfer,
                          JobEffects* fx) {
  if (entry >= entries_.size()) return false;
  Entry& e = entries_[entry];
  if (e.state != Entry::State::kInFlight || e.seq != seq) return false;
  FL_DCHECK(in_flight_ > 0, "a write in flight that the window did not count");
  --in_flight_;
  switch (ClassifyCompletion(completion)) {
    case WriteOutcome::kLanded: {
      const int64_t waited = Unreserve(e.choice, e.chunk.bytes);
      if (waited > 0) {
        fx->give_back_nic = e.choice.nic;
        fx->give_back_ns = waited;
      }
      // The fabric waited on the slot's fence before it read the slot: it is free.
      if (e.relay.valid()) env_.relay->Release(e.relay);
      e.relay = relay::Slot{};
      e.state = Entry::State::kFree;
      free_.push_back(entry);
      FL_DCHECK(free_.size() + in_flight_ <= entries_.size(),
                "a window entry freed twice");
      acked_.Add(e.chunk.target_offset, e.chunk.bytes);
      fx->notify = true;
      if (transfer.AddDone(e.choice.nic, e.chunk.layer, e.chunk.bytes)) {
        fx->progress_only = false;  // a layer is done
      }
      return true;
    }
    case WriteOutcome::kRefused:
      Drop(entry, /*failed=*/false, fx);
      SetTrouble(Trouble::kRefused, completion.status);
      Halt(fx);
      return true;
    case WriteOutcome::kNicFault:
      LoseNic(entry, completion.status, fx);
      return true;
    case WriteOutcome::kFailed:
      Drop(entry, /*failed=*/true, fx);
      SetTrouble(Trouble::kFailed, completion.status);
      Halt(fx);
      return true;
  }
  return true;
}

void Window::Halt(JobEffects* fx) {
  halted_ = true;
  again_.clear();
  if (parked_ >= 0) {
    const auto index = static_cast<uint16_t>(parked_);
    parked_ = -1;
    Drop(index, /*failed=*/false, fx);
  }
}

}  // namespace fuselink::transfer
