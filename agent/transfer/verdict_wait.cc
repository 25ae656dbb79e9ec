#include "agent/transfer/verdict_wait.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::transfer {

void VerdictWait::Start(Why why, absl::Time now, absl::Time deadline,
                        absl::Status fallback) {
  active_ = true;
  asking_ = false;
  why_ = why;
  asked_ = 0;
  errors_ = 0;
  fallback_ = std::move(fallback);
  next_ask_ = now + options_.notice_wait;
  // A refusal is bounded by its questions alone: the first answer, or the errors.
  give_up_ = why == Why::kRefused
                 ? absl::InfiniteFuture()
                 : std::max(std::min(deadline, now + options_.give_up_after), next_ask_);
}

absl::Time VerdictWait::next() const {
  if (!active_ || asking_) return absl::InfiniteFuture();
  return asked_ > 0 ? std::min(next_ask_, give_up_) : next_ask_;
}

VerdictWait::Step VerdictWait::OnTimer(absl::Time now) {
  if (!active_ || asking_) return Step::kNone;
  if (asked_ > 0 && now >= give_up_) {
    active_ = false;
    return Step::kGiveUp;
  }
  if (now < next_ask_) return Step::kNone;
  asking_ = true;
  ++asked_;
  return Step::kAsk;
}

VerdictWait::Answer VerdictWait::OnReply(
    const absl::StatusOr<std::optional<absl::Status>>& reply, absl::Time now) {
  asking_ = false;
  if (!active_) return Answer{};
  Answer answer;
  if (reply.ok() && reply->has_value()) {
    answer = Answer{true, **reply, true};
  } else if (reply.ok()) {  // the target holds the transfer open: it has not decided
    if (why_ == Why::kRefused || now >= give_up_) answer = Answer{true, fallback_, false};
  } else if (++errors_ >= options_.max_query_errors || now >= give_up_) {
    answer = Answer{true, fallback_, false};
  }
  if (answer.done) {
    active_ = false;
  } else {
    next_ask_ = now + options_.query_every;
  }
  return answer;
}

absl::Status NoVerdictStatus(absl::string_view target_node) {
  return WithReason(absl::UnavailableError(absl::StrCat(
                        "no verdict from target node '", BoundedForMessage(target_node),
                        "': the transfer may or may not have landed there")),
                    reasons::kNoVerdict);
}

}  // namespace fuselink::transfer
