#include "agent/transfer/verdict.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::transfer {
namespace {

struct Entry {
  Verdict verdict;
  absl::StatusCode code;
  Reason reason;  // unused (empty) for kCompleted
  absl::string_view message;
};

constexpr std::array<Entry, 9> kVerdicts = {{
    {Verdict::kCompleted, absl::StatusCode::kOk, {}, "completed"},
    {Verdict::kIncompleteCommit, absl::StatusCode::kDataLoss, reasons::kIncompleteCommit,
     "the source committed before every byte of the prepared blocks landed"},
    {Verdict::kSourceIdle, absl::StatusCode::kUnavailable, reasons::kSourceIdle,
     "no data from the source for too long"},
    {Verdict::kSourceAborted, absl::StatusCode::kAborted, reasons::kSourceAborted,
     "the source stopped the transfer"},
    {Verdict::kOwnerExited, absl::StatusCode::kFailedPrecondition, reasons::kOwnerExited,
     "the process that lent the target tensor exited"},
    {Verdict::kPeerLost, absl::StatusCode::kUnavailable, reasons::kPeerLost,
     "the target lost its connections to the source"},
    {Verdict::kShuttingDown, absl::StatusCode::kUnavailable, reasons::kShuttingDown,
     "the target agent is shutting down"},
    {Verdict::kProtocol, absl::StatusCode::kInvalidArgument, reasons::kProtocol,
     "the source's writes broke the transfer protocol"},
    {Verdict::kTargetFailed, absl::StatusCode::kInternal, reasons::kTargetFailed,
     "the target failed the transfer"},
}};

const Entry& Find(uint8_t verdict) {
  for (const Entry& e : kVerdicts) {
    if (static_cast<uint8_t>(e.verdict) == verdict) return e;
  }
  return kVerdicts.back();
}

}  // namespace

Verdict VerdictOf(const absl::Status& status) {
  if (status.ok()) return Verdict::kCompleted;
  const std::string reason = ReasonOf(status);
  for (const Entry& e : kVerdicts) {
    if (!e.reason.name.empty() && e.reason == reason) return e.verdict;
  }
  return Verdict::kTargetFailed;
}

absl::Status VerdictStatus(uint8_t verdict, absl::string_view target_node) {
  const Entry& e = Find(verdict);
  if (e.code == absl::StatusCode::kOk) return absl::OkStatus();
  return WithReason(
      absl::Status(e.code, absl::StrCat("target node '", target_node, "': ", e.message)),
      e.reason);
}

absl::Status TargetStatus(Verdict verdict) {
  const Entry& e = Find(static_cast<uint8_t>(verdict));
  if (e.code == absl::StatusCode::kOk) return absl::OkStatus();
  return WithReason(absl::Status(e.code, e.message), e.reason);
}

}  // namespace fuselink::transfer
