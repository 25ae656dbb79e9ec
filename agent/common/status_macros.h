// Early-return helpers for absl::Status and absl::StatusOr.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "agent/common/errors.h"

// Returns the status of `expr` from the enclosing function when it is not OK.
#define FL_RETURN_IF_ERROR(expr)                    \
  do {                                              \
    if (absl::Status _fl_s = (expr); !_fl_s.ok()) { \
      return _fl_s;                                 \
    }                                               \
  } while (0)

#define FL_CONCAT_INNER(a, b) a##b
#define FL_CONCAT(a, b) FL_CONCAT_INNER(a, b)

// `lhs = value of expr`, or returns its status from the enclosing function.
#define FL_ASSIGN_OR_RETURN(lhs, expr) \
  FL_ASSIGN_OR_RETURN_IMPL(FL_CONCAT(_fl_or_, __LINE__), lhs, expr)
#define FL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

namespace fuselink {

// The one place an errno becomes a Status: the failed call's text, errno's name,
// and a code chosen by what the caller should do about it.
absl::Status ErrnoStatus(absl::string_view call, int err);

}  // namespace fuselink

namespace fuselink {

// Errors carry a machine-readable reason (UPPER_SNAKE_CASE) as a payload; the gRPC
// layer turns it into google.rpc.ErrorInfo.
inline constexpr absl::string_view kReasonPayloadUrl = "type.fuselink.dev/reason";

// `status` with `reason`, one of the catalogue's (errors.h).
absl::Status WithReason(absl::Status status, const Reason& reason);
// `status` with a reason the agent passes on without making it: a peer's (read off
// its answer, already checked to be UPPER_SNAKE_CASE) or the CUDA driver's name for
// an error (the catalogue's CUDA_ERROR_* family). Never for a reason of our own.
absl::Status WithForeignReason(absl::Status status, absl::string_view reason);
// The reason attached by WithReason or WithForeignReason, or empty.
std::string ReasonOf(const absl::Status& status);

// `status` with every payload of `from`, its reason among them: an error made of
// another, with a code and message of its own (a write failed UNAVAILABLE because its
// connection closed FABRIC_ACK_TIMEOUT).
absl::Status WithPayloadsOf(absl::Status status, const absl::Status& from);

// `status` with `context` (where it came from: "node 'b'", "NIC 2") before its
// message; the same code and payloads, the reason among them. OK stays OK. For an
// error crossing a boundary (a peer's answer, one part's error answered by another)
// whose message would not say where it arose.
absl::Status WithContext(const absl::Status& status, absl::string_view context);

// Client-supplied text (a name, an id) as an error message may echo it: at most
// kMaxEchoBytes bytes in all, every byte outside printable ASCII (and the backslash)
// written as \xNN so that the message stays readable and valid UTF-8, and the text cut
// with a trailing "..." when it does not fit. Every message that quotes a request's
// string goes through this, so that a megabyte of name never becomes a megabyte of
// error, log line or metric label.
inline constexpr size_t kMaxEchoBytes = 64;
std::string BoundedForMessage(absl::string_view text);

}  // namespace fuselink
