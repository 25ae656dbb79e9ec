// A job's course at its source (the class: job.h): made at admission, it has the
// target prepare (BeginPrepare, OnPrepared), takes its caller's calls (Stop,
// SetLayersReady, ExtendLease), and after every event Settle moves it on: the
// window posts what it can, the commit goes, a decided job ends once drained.
// What comes back to a job is in job_completions.cc; how it ends, job_ending.cc.
#include "agent/transfer/job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/admission.h"
#include "agent/transfer/preparer.h"

namespace fuselink::transfer {
namespace {

absl::Status FinishedStatus(absl::string_view why) {
  return WithReason(absl::FailedPreconditionError(why), reasons::kTransferFinished);
}

}  // namespace

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
