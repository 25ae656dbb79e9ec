// How an options struct refuses a field out of its range. Each options struct that an
// outside source fills (services/flags_read.cc, from the agent's flags) has an
// `absl::Status Validate() const` that checks its own fields against its own named
// limits and answers INVALID_ARGUMENT made here: the message opens with the field's
// name ("window_chunks must be 1 to 1024, not 0") and the field's name rides along as
// a payload, so that whoever filled the field can put its own name for it in front
// (FieldOf: "--window_chunks must be 1 to 1024, not 0"). A struct that holds another
// struct validates it and prefixes its fields (WithinField: "engine.window_chunks").
//
// Example:
//   absl::Status LandingOptions::Validate() const {
//     return InRange("max_per_source", max_per_source, 1u, kMaxIncoming);
//   }
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/common/check.h"

namespace fuselink {

inline constexpr absl::string_view kFieldPayloadUrl = "type.fuselink.dev/field";

// INVALID_ARGUMENT: "`field` `want`", naming `field` in its payload too.
absl::Status BadField(absl::string_view field, absl::string_view want);

// OK when lo <= value <= hi (NaN is never in range), else BadField with the range.
template <typename T>
absl::Status InRange(absl::string_view field, T value, T lo, T hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return BadField(field, absl::StrCat("must be ", lo, " to ", hi, ", not ", value));
}

// OK when lo <= value, else BadField with the bound.
template <typename T>
absl::Status AtLeast(absl::string_view field, T value, T lo) {
  if (value >= lo) return absl::OkStatus();
  return BadField(field, absl::StrCat("must be at least ", lo, ", not ", value));
}

absl::Status InRange(absl::string_view field, absl::Duration value, absl::Duration lo,
                     absl::Duration hi);

// The field a BadField status names, or empty for any other status.
std::string FieldOf(const absl::Status& status);

// `status` (from a held struct's Validate) with its field prefixed "`prefix`.".
absl::Status WithinField(absl::string_view prefix, const absl::Status& status);

}  // namespace fuselink

// For a part's constructor: options that reach it out of range (a caller that skipped
// Validate) are a programmer's error; it aborts naming the field.
#define FL_CHECK_OK(expr)                                                \
  do {                                                                   \
    if (absl::Status _fl_s = (expr); !_fl_s.ok()) {                      \
      ::fuselink::InvariantBroken(__FILE__, __LINE__, #expr,             \
                                  std::string(_fl_s.message()).c_str()); \
    }                                                                    \
  } while (0)
