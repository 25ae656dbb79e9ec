// What comes back to a job (the class: job.h): its writes' completions, the
// commit's among them, and the window's trouble they leave (TakeTrouble); the
// target's verdict notice and the answers to the job's questions, FromTarget
// saying whose end a verdict is; and its timer (deadline, lease, drain bound, the
// verdict wait's steps). A commit whose NIC failed goes again on another NIC at
// the next Settle; the window fails its own chunks over (window.cc).
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/admission.h"
#include "agent/transfer/job.h"
#include "agent/transfer/verdict.h"

namespace fuselink::transfer {

absl::Status EarlyVerdictStatus(absl::string_view target_node) {
  return WithReason(absl::InternalError(absl::StrCat(
                        "target node '", BoundedForMessage(target_node),
                        "' said the transfer completed before the source committed it")),
                    reasons::kTargetProtocol);
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

absl::Status Job::FromTarget(absl::Status verdict) const {
  if (verdict.ok() && !commit_posted_) return EarlyVerdictStatus(target_node());
  return verdict;
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

}  // namespace fuselink::transfer
