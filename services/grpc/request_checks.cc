#include "services/grpc/request_checks.h"

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::services {

absl::Status CheckDeadline(const v1::TransferRequest& request, absl::Time now) {
  if (!request.has_deadline()) return absl::OkStatus();
  const google::protobuf::Timestamp& deadline = request.deadline();
  if (deadline.nanos() < 0 || deadline.nanos() > kMaxTimestampNanos) {
    return WithReason(absl::InvalidArgumentError(
                          absl::StrCat("deadline.nanos is ", deadline.nanos(),
                                       "; it must be 0 to ", kMaxTimestampNanos)),
                      reasons::kBadDeadline);
  }
  // Exact for every int64 seconds; only the very largest saturate to the infinite
  // future, which is no deadline.
  const absl::Time at =
      absl::FromUnixSeconds(deadline.seconds()) + absl::Nanoseconds(deadline.nanos());
  if (at <= now) {
    return WithReason(
        absl::DeadlineExceededError("the request's deadline passed before it arrived"),
        reasons::kDeadline);
  }
  return absl::OkStatus();
}

}  // namespace fuselink::services
