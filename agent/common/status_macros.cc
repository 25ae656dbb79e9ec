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

absl::Status WithReason(absl::Status status, const Reason& reason) {
  return WithForeignReason(std::move(status), reason.name);
}

absl::Status WithForeignReason(absl::Status status, absl::string_view reason) {
  status.SetPayload(kReasonPayloadUrl, absl::Cord(reason));
  return status;
}

absl::Status WithPayloadsOf(absl::Status status, const absl::Status& from) {
  if (status.ok()) return status;
  from.ForEachPayload([&status](absl::string_view url, const absl::Cord& payload) {
    status.SetPayload(url, payload);
  });
  return status;
}

std::string ReasonOf(const absl::Status& status) {
  auto payload = status.GetPayload(kReasonPayloadUrl);
  return payload ? std::string(*payload) : std::string();
}

absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, payload);
  });
  return out;
}

std::string BoundedForMessage(absl::string_view text) {
  constexpr absl::string_view kCut = "...";
  static_assert(kMaxEchoBytes >= kCut.size() + 4, "room for an escaped byte and the cut");
  std::string out;
  size_t keep = 0;  // the longest prefix of whole pieces that leaves room for the cut
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += ch;
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(c, absl::kZeroPad2));
    }
    if (out.size() <= kMaxEchoBytes - kCut.size()) keep = out.size();
    if (out.size() > kMaxEchoBytes) break;  // cut for sure; the rest does not matter
  }
  if (out.size() <= kMaxEchoBytes) return out;
  out.resize(keep);
  return absl::StrCat(out, kCut);
}

}  // namespace fuselink
