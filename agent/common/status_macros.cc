#include "agent/common/status_macros.h"

#include <optional>
#include <string>

#include "absl/strings/cord.h"

namespace fuselink {

absl::Status ErrnoStatus(absl::string_view call, int err) {
  std::string message = absl::StrCat(call, ": ", std::strerror(err));
  switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EAGAIN:
    case EINTR:
      return absl::UnavailableError(message);
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case ENOSPC:
      return absl::ResourceExhaustedError(message);
    case EINVAL:
    case EBADF:
    case ENOENT:
    case EADDRNOTAVAIL:
      return absl::InvalidArgumentError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace fuselink

namespace fuselink {

absl::Status WithReason(absl::Status status, absl::string_view reason) {
  status.SetPayload(kReasonPayloadUrl, absl::Cord(reason));
  return status;
}

std::string ReasonOf(const absl::Status& status) {
  auto payload = status.GetPayload(kReasonPayloadUrl);
  return payload ? std::string(*payload) : std::string();
}

}  // namespace fuselink
