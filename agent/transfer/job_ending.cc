// How a job ends (the class: job.h): the commit it posts and the abort notice it
// owes the target, its end decided (Decide) or left to the target's verdict
// (AwaitVerdict), and Finish once nothing of it is in flight: the transfer's final
// state, the tensor and the owner's NIC let go of, and the event its outgoing
// watches hear (OutgoingEvent).
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/job.h"
#include "agent/transfer/preparer.h"
#include "agent/transfer/wr_id.h"

namespace fuselink::transfer {

void Job::Decide(absl::Status outcome, bool abort, JobEffects* fx) {
  FL_DCHECK(!outcome_ && phase_ != Phase::kDone, "a job is decided once");
  outcome_ = std::move(outcome);
  drain_until_ = now() + ctx_->options.drain_bound;
  abort_owed_ = abort && !verdict_seen_;
  if (window_) window_->Halt(fx);
  const State s = transfer_->state_locked();
  if (s == State::kPreparing || s == State::kRunning) {
    transfer_->SetState(State::kStopping, absl::OkStatus());  // the end is told later
  }
}

void Job::AwaitVerdict(VerdictWait::Why why, absl::Status fallback) {
  wait_.Start(why, now(), transfer_->deadline(), std::move(fallback));
}

void Job::PostCommit(JobEffects* fx) {
  int nic = -1;
  absl::Status error;
  const uint32_t imm = EncodeImm(SlotId::Unpack(target_->slot), ImmOp::kCommit);
  const uint64_t wr_id = EncodeWrId(WrId{serial_, commit_entry(), ++commit_seq_});
  switch (PostNotice(*ctx_->fabric, target_->peer, reach_, direct_nic_, imm, wr_id, &nic,
                     &error)) {
    case PostOutcome::kPosted:
      commit_posted_ = true;
      commit_in_flight_ = true;
      commit_nic_ = nic;
      break;
    case PostOutcome::kQueueFull:
      fx->wait = true;  // a full queue delays the commit; it never fails the transfer
      break;
    case PostOutcome::kNicFault: {
      fx->nic_lost = true;
      const absl::Status lost = PeerLostStatus(
          target_node(), absl::UnavailableError("no NIC took the commit notice"));
      if (commit_posted_) {
        // A commit went out before: the target may have decided; ask it.
        phase_ = Phase::kTargetDecides;
        AwaitVerdict(VerdictWait::Why::kCommitted, lost);
      } else {
        Decide(lost, /*abort=*/false, fx);
      }
      break;
    }
    case PostOutcome::kFailed:
      Decide(error, /*abort=*/true, fx);
      break;
  }
}

void Job::PostAbort(JobEffects* fx) {
  if (ctx_->posting_stopped.load() || !target_) {
    abort_ = AbortState::kDropped;
    return;
  }
  int nic = -1;
  absl::Status error;
  const uint32_t imm = EncodeImm(SlotId::Unpack(target_->slot), ImmOp::kAbort);
  switch (PostNotice(*ctx_->fabric, target_->peer, reach_, direct_nic_, imm, /*wr_id=*/0,
                     &nic, &error)) {
    case PostOutcome::kPosted:
      abort_ = AbortState::kSent;
      break;
    case PostOutcome::kQueueFull:
      fx->wait = true;
      break;
    case PostOutcome::kNicFault:
    case PostOutcome::kFailed:
      abort_ = AbortState::kDropped;
      break;
  }
}

void Job::Finish(JobEffects* fx) {
  // Its tensor is let go of below: no write of it may still read or place bytes.
  FL_CHECK(in_flight() == 0, "a job ends with writes in flight");
  const absl::Status outcome = *outcome_;
  const State state = outcome.ok()                 ? State::kCompleted
                      : absl::IsCancelled(outcome) ? State::kCancelled
                                                   : State::kFailed;
  transfer_->SetState(state, outcome);
  transfer_->HoldEnd();  // heard once the engine let go of the tensor and the share
  fx->final_state = state;
  fx->elapsed = transfer_->elapsed_locked();
  fx->total_bytes = transfer_->total_bytes_locked();
  phase_ = Phase::kDone;
  fx->finished = true;
  fx->notify = true;
  fx->progress_only = false;
  // A caller retries UNAVAILABLE and ABORTED under the same request id; a request the
  // target never accepted never started.
  fx->free_request_id =
      !accepted_ || absl::IsUnavailable(outcome) || absl::IsAborted(outcome);
  fx->released = std::move(source_);  // the source tensor may be unregistered now
  fx->outgoing = OutgoingEvent(outcome);
  window_.reset();  // nothing is in flight: a kept transfer holds no extents
  if (accepted_) ctx_->scheduler->OwnerStopped(direct_nic_);
  if (abort_owed_ && target_ && !verdict_seen_) {
    abort_ = AbortState::kPending;
    abort_until_ = now() + ctx_->options.abort_patience;
  }
}

v1::WatchEvent Job::OutgoingEvent(const absl::Status& outcome) const {
  const v1::TransferRequest& request = transfer_->request();
  v1::WatchEvent e;
  e.set_outgoing(true);
  e.set_transfer_id(transfer_->id());
  e.set_source_node(request.source().node());
  e.set_target_node(target_node());
  e.set_tensor(request.source().tensor());
  *e.mutable_block_ids() = request.source().block_ids();
  const LayerRange layers = Layers(request, source_layout_);
  e.mutable_layers()->set_begin(layers.begin);
  e.mutable_layers()->set_end(layers.end);
  e.set_bytes(transfer_->bytes_done_locked());
  e.set_code(static_cast<int>(outcome.code()));
  e.set_message(std::string(outcome.message()));
  e.set_reason(ReasonOf(outcome));
  if (window_ && target_) {
    // What the target acknowledged, block by block in its own layout.
    const auto& target_ids = request.target().block_ids();
    const auto& source_ids = request.source().block_ids();
    SetCoverage(outcome.ok(), target_->layout,
                {target_ids.data(), static_cast<size_t>(target_ids.size())},
                {source_ids.data(), static_cast<size_t>(source_ids.size())}, layers.begin,
                layers.end, window_->acked(), &e);
  } else {
    *e.mutable_failed_block_ids() = request.source().block_ids();  // none left
  }
  return e;
}

}  // namespace fuselink::transfer
