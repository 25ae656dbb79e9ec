#include "agent/transfer/job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/admission.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/preparer.h"
#include "agent/transfer/verdict.h"
#include "agent/transfer/wr_id.h"

namespace fuselink::transfer {
namespace {

absl::Status FinishedStatus(absl::string_view why) {
  return WithReason(absl::FailedPreconditionError(why), reasons::kTransferFinished);
}

}  // namespace

absl::Status EarlyVerdictStatus(absl::string_view target_node) {
  return WithReason(absl::InternalError(absl::StrCat(
                        "target node '", BoundedForMessage(target_node),
                        "' said the transfer completed before the source committed it")),
                    reasons::kTargetProtocol);
}

Job::Job(uint32_t serial, std::shared_ptr<Transfer> transfer, memory::TensorLease source,
         int direct_nic, JobContext* ctx, std::string requester)
    : serial_(serial),
      transfer_(std::move(transfer)),
      direct_nic_(direct_nic),
      ctx_(ctx),
      source_layout_(source.info().layout),
      requester_(std::move(requester)),
      source_(std::move(source)),
      reach_(ctx->lanes),
      wait_(ctx->options.verdict) {
  const LayerRange layers = Layers(transfer_->request(), source_layout_);
  ready_end_ = transfer_->request().layer_by_layer() ? layers.begin : layers.end;
  if (const uint32_t lease = transfer_->request().lease_ms(); lease > 0) {
    lease_until_ = now() + absl::Milliseconds(lease);
  }
}

std::optional<IncomingSpec> Job::BeginPrepare(JobEffects* fx) {
  if (phase_ == Phase::kPreparing && !outcome_) {
    if (now() >= transfer_->deadline()) {
      Decide(DeadlineStatus(), /*abort=*/false, fx);
    } else if (now() >= lease_until_) {
      Decide(LeaseExpiredStatus(), /*abort=*/false, fx);
    } else {
      prepare_running_ = true;
      IncomingSpec spec = MakeIncomingSpec(*transfer_, source_.info(), direct_nic_);
      spec.in_flight_bytes =
          uint64_t{ctx_->options.window_chunks} * ctx_->options.chunk_bytes;
      return spec;
    }
  }
  Settle(fx);
  return std::nullopt;
}

void Job::OnPrepared(absl::StatusOr<Prepared> prepared,
                     absl::StatusOr<std::vector<Extent>> plan, JobEffects* fx) {
  prepare_running_ = false;
  if (!prepared.ok()) {
    if (!outcome_) Decide(prepared.status(), /*abort=*/false, fx);
    return Settle(fx);
  }
  target_ = *prepared;
  if (outcome_) {  // stopped while the target prepared: it lets go of the slot
    abort_owed_ = true;
    return Settle(fx);
  }
  if (!plan.ok()) {  // the target's answer cannot hold the request
    Decide(plan.status(), /*abort=*/true, fx);
    return Settle(fx);
  }
  std::vector<Extent> extents = *std::move(plan);
  const JobOptions& o = ctx_->options;
  uint64_t total_bytes = 0;
  for (const Extent& e : extents) total_bytes += e.bytes;
  const uint64_t chunks = CountChunks(extents, o.chunk_bytes);
  const LayerRange layers = Layers(transfer_->request(), source_layout_);
  const WindowEnv env{ctx_->fabric, ctx_->scheduler,
                      source_.gpu() >= 0 ? ctx_->gpu_relay : nullptr};
  SourceMemory memory{source_.regions(), source_.gpu()};
  window_.emplace(env, serial_, direct_nic_, std::move(memory), *target_,
                  std::move(extents), o.chunk_bytes, o.window_chunks, &reach_,
                  target_node());
  window_->set_ready_end(ready_end_);
  accepted_ = true;
  phase_ = Phase::kSending;
  ctx_->scheduler->OwnerStarted(direct_nic_);  // its owner is busy from now on
  transfer_->AcceptLocked(total_bytes, chunks, layers.begin, layers.end - layers.begin,
                          ctx_->transport, sched::PolicyName(ctx_->scheduler->policy()));
  fx->notify = true;
  fx->progress_only = false;
  Settle(fx);
}

bool Job::OnCompletion(uint16_t entry, uint16_t seq, const fabric::Completion& completion,
                       JobEffects* fx) {
  if (entry != commit_entry()) {
    if (!window_ || !window_->OnCompletion(entry, seq, completion, *transfer_, fx)) {
      return false;
    }
    Settle(fx);
    return true;
  }
  if (!commit_in_flight_ || seq != commit_seq_) return false;
  commit_in_flight_ = false;
  switch (ClassifyCompletion(completion)) {
    case WriteOutcome::kLanded:
      // The target has the commit; only its verdict says how the transfer ended.
      commit_landed_ = true;
      if (!outcome_ && phase_ == Phase::kCommitting) {
        AwaitVerdict(VerdictWait::Why::kCommitted, NoVerdictStatus(target_node()));
      }
      break;
    case WriteOutcome::kRefused:
      if (!outcome_ && phase_ == Phase::kCommitting) {
        phase_ = Phase::kTargetDecides;
        AwaitVerdict(VerdictWait::Why::kRefused, completion.status);
      }
      break;
    case WriteOutcome::kNicFault:
      fx->NoteNicLost(completion.status);
      [[fallthrough]];
    case WriteOutcome::kFailed:
      // It may have landed or not; a commit sent twice is harmless (the target answers
      // a repeated commit with its verdict). Settle sends it again on another NIC.
      reach_.Lose(commit_nic_);
      break;
  }
  Settle(fx);
  return true;
}

void Job::OnVerdict(uint8_t verdict, JobEffects* fx) {
  if (!target_ || verdict_seen_) return;  // a repeated notice
  verdict_seen_ = true;
  abort_owed_ = false;  // the target has ended its slot
  if (abort_ == AbortState::kPending) abort_ = AbortState::kDropped;
  if (phase_ != Phase::kDone && !outcome_) {
    // The source's own decision, when it came first, stands; else the target's.
    Decide(FromTarget(VerdictStatus(verdict, BoundedForMessage(target_node()))),
           /*abort=*/false, fx);
  }
  Settle(fx);
}

void Job::OnVerdictReply(const absl::StatusOr<std::optional<absl::Status>>& reply,
                         JobEffects* fx) {
  const VerdictWait::Answer answer = wait_.OnReply(reply, now());
  if (answer.done && phase_ != Phase::kDone && !outcome_) {
    if (answer.from_target) {
      verdict_seen_ = true;
      Decide(FromTarget(answer.status), /*abort=*/false, fx);
    } else {  // the target has not decided, or cannot be asked: tell it we stop
      Decide(answer.status, /*abort=*/true, fx);
    }
  }
  Settle(fx);
}

void Job::OnProbeReply(const absl::Status& reply, JobEffects* fx) {
  probing_ = false;
  const bool silent = absl::IsDeadlineExceeded(reply) || absl::IsUnavailable(reply);
  if (silent && phase_ != Phase::kDone && !outcome_) {
    // Neither its NICs nor its agent answer: no other NIC would. No abort notice
    // either: it would wait out another ACK bound on a NIC the target does not read.
    Decide(WithReason(absl::UnavailableError(absl::StrCat(
                          "node '", BoundedForMessage(target_node()),
                          "' stopped answering: a write saw no ACK within the fabric's "
                          "bound, and its agent did not answer a question either (",
                          absl::StatusCodeToString(reply.code()), ")")),
                      reasons::kPeerLost),
           /*abort=*/false, fx);
  }
  Settle(fx);
}

void Job::OnTimer(JobEffects* fx) {
  const absl::Time t = now();
  if (DrainPending() && target_ && t >= drain_until_) {
    drain_forced_ = true;
    fx->disconnect = target_->peer;  // its writes fail; the job ends as they come back
  }
  if (phase_ != Phase::kDone && !outcome_) {
    if (SourceMayStop() && t >= transfer_->deadline()) {
      Decide(DeadlineStatus(), /*abort=*/true, fx);
    } else if (SourceMayStop() && t >= lease_until_) {
      Decide(LeaseExpiredStatus(), /*abort=*/true, fx);
    } else if (wait_.active()) {
      switch (wait_.OnTimer(t)) {
        case VerdictWait::Step::kAsk:
          fx->query = true;
          fx->query_deadline = wait_.QueryDeadline(t);
          break;
        case VerdictWait::Step::kGiveUp:
          Decide(wait_.fallback(), /*abort=*/true, fx);
          break;
        case VerdictWait::Step::kNone:
          break;
      }
    }
  }
  if (phase_ == Phase::kDone && abort_ == AbortState::kPending && t >= abort_until_) {
    abort_ = AbortState::kDropped;  // the target ends a silent slot on its own
  }
  Settle(fx);
}

void Job::Resume(JobEffects* fx) {
  listed_ = false;
  Settle(fx);
}

void Job::Refresh(JobEffects* fx) { Settle(fx); }

absl::Status Job::Stop(absl::Status why, bool force, JobEffects* fx) {
  if (phase_ == Phase::kDone || outcome_) {
    return FinishedStatus("the transfer has already finished or is stopping");
  }
  if (!force && !SourceMayStop()) {
    return FinishedStatus(
        "the transfer is committed or refused: its end is the target's to decide");
  }
  Decide(std::move(why), /*abort=*/true, fx);
  Settle(fx);
  return absl::OkStatus();
}

absl::Status Job::SetLayersReady(uint32_t end, JobEffects* fx) {
  if (!transfer_->request().layer_by_layer()) {
    return WithReason(absl::FailedPreconditionError(
                          "the transfer was not started layer by layer: every layer is "
                          "ready already"),
                      reasons::kNotLayerByLayer);
  }
  if (phase_ == Phase::kDone || outcome_.has_value()) {
    return FinishedStatus("the transfer has already finished or is stopping");
  }
  const LayerRange layers = Layers(transfer_->request(), source_layout_);
  if (end > layers.end) {
    return WithReason(absl::OutOfRangeError(absl::StrCat(
                          "ready_end ", end, " is past the transfer's layers [",
                          layers.begin, ", ", layers.end, ")")),
                      reasons::kLayerOutOfRange);
  }
  if (end <= ready_end_) return absl::OkStatus();
  ready_end_ = end;
  if (window_) window_->set_ready_end(end);
  Settle(fx);
  return absl::OkStatus();
}

absl::Status Job::ExtendLease(uint32_t lease_ms, JobEffects* fx) {
  if (transfer_->request().lease_ms() == 0) {
    return WithReason(
        absl::FailedPreconditionError("the transfer was started without a lease"),
        reasons::kNoLease);
  }
  if (phase_ == Phase::kDone || outcome_.has_value()) {
    return FinishedStatus("the transfer has already finished or is stopping");
  }
  const uint32_t lease = lease_ms > 0 ? lease_ms : transfer_->request().lease_ms();
  lease_until_ = std::max(lease_until_, now() + absl::Milliseconds(lease));
  Settle(fx);
  return absl::OkStatus();
}

void Job::SetRemoteIdle(uint32_t mask) {
  if (window_) window_->set_remote_idle(mask);
}

bool Job::UsesTensor(uint64_t tensor_id) const {
  return source_.valid() && source_.id() == tensor_id;
}

std::optional<fabric::PeerId> Job::peer() const {
  if (!target_) return std::nullopt;
  return target_->peer;
}

bool Job::SourceMayStop() const {
  return !commit_posted_ && phase_ != Phase::kTargetDecides;
}

uint32_t Job::in_flight() const {
  return (prepare_running_ ? 1 : 0) + writes_in_flight();
}

uint32_t Job::writes_in_flight() const {
  return (window_ ? window_->in_flight() : 0) + (commit_in_flight_ ? 1 : 0);
}

bool Job::DrainPending() const {
  return outcome_ && phase_ != Phase::kDone && !drain_forced_ && writes_in_flight() > 0;
}

absl::Status Job::FromTarget(absl::Status verdict) const {
  if (verdict.ok() && !commit_posted_) return EarlyVerdictStatus(target_node());
  return verdict;
}

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

void Job::TakeTrouble(JobEffects* fx) {
  if (!window_ || window_->trouble() == Window::Trouble::kNone) return;
  const Window::Trouble trouble = window_->trouble();
  absl::Status status = window_->TakeTrouble();
  if (outcome_ || phase_ != Phase::kSending) return;  // decided already
  switch (trouble) {
    case Window::Trouble::kRefused:
      // The target decides: stop posting, blame no NIC, wait for its verdict.
      phase_ = Phase::kTargetDecides;
      transfer_->SetState(State::kStopping, absl::OkStatus());
      AwaitVerdict(VerdictWait::Why::kRefused, std::move(status));
      break;
    case Window::Trouble::kPeerLost:
      Decide(std::move(status), /*abort=*/false, fx);  // no NIC is left to say it on
      break;
    case Window::Trouble::kFailed:
      Decide(std::move(status), /*abort=*/true, fx);
      break;
    case Window::Trouble::kNone:
      break;
  }
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

void Job::AskIfSilent(JobEffects* fx) {
  if (fx->target_silent && !probing_ && target_ && phase_ != Phase::kDone && !outcome_) {
    probing_ = true;
    fx->probe = true;
    fx->probe_deadline = wait_.QueryDeadline(now());
  }
}

void Job::Settle(JobEffects* fx) {
  AskIfSilent(fx);
  // Each pass moves the phase on or stops; the phases only go forward.
  for (;;) {
    TakeTrouble(fx);
    if (phase_ == Phase::kDone) {
      if (abort_ == AbortState::kPending) PostAbort(fx);
      break;
    }
    if (outcome_) {
      if (in_flight() > 0) break;  // its writes name it: it ends when they are back
      Finish(fx);
      continue;
    }
    if (phase_ == Phase::kSending) {
      if (!ctx_->posting_stopped.load() && !probing_) window_->Pump(fx);
      TakeTrouble(fx);
      if (outcome_ || phase_ != Phase::kSending) continue;
      if (!window_->all_landed(*transfer_)) break;
      phase_ = Phase::kCommitting;  // every chunk landed, each once: commit
      continue;
    }
    if (phase_ == Phase::kCommitting && !commit_in_flight_ && !commit_landed_ &&
        !ctx_->posting_stopped.load() && !probing_) {
      PostCommit(fx);
      if (outcome_ || phase_ != Phase::kCommitting) continue;
    }
    break;
  }

  // Waiting makes sense only while something is left to post.
  const bool may_post =
      phase_ == Phase::kDone
          ? abort_ == AbortState::kPending
          : !outcome_ && (phase_ == Phase::kSending || phase_ == Phase::kCommitting);
  if (fx->wait) {
    if (listed_ || !may_post) {
      fx->wait = false;
    } else {
      listed_ = true;
    }
  }
  absl::Time t = absl::InfiniteFuture();
  if (phase_ != Phase::kDone && !outcome_) {
    if (SourceMayStop()) t = std::min({t, transfer_->deadline(), lease_until_});
    if (wait_.active()) t = std::min(t, wait_.next());
  }
  if (DrainPending()) t = std::min(t, drain_until_);
  if (listed_ && may_post && in_flight() == 0) {
    // Nothing of its own will complete to wake it: try again on a timer too.
    t = std::min(t, now() + ctx_->options.wait_backstop);
  }
  if (phase_ == Phase::kDone && abort_ == AbortState::kPending) {
    t = std::min(t, abort_until_);
  }
  timer_ = t;
}

}  // namespace fuselink::transfer
