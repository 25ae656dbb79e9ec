#include "agent/common/options.h"

#include "absl/strings/cord.h"
#include "absl/strings/match.h"

namespace fuselink {

absl::Status BadField(absl::string_view field, absl::string_view want) {
  absl::Status status = absl::InvalidArgumentError(absl::StrCat(field, " ", want));
  status.SetPayload(kFieldPayloadUrl, absl::Cord(field));
  return status;
}

absl::Status InRange(absl::string_view field, absl::Duration value, absl::Duration lo,
                     absl::Duration hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return BadField(field, absl::StrCat("must be ", absl::FormatDuration(lo), " to ",
                                      absl::FormatDuration(hi), ", not ",
                                      absl::FormatDuration(value)));
}

std::string FieldOf(const absl::Status& status) {
  const auto field = status.GetPayload(kFieldPayloadUrl);
  return field ? std::string(*field) : std::string();
}

absl::Status WithinField(absl::string_view prefix, const absl::Status& status) {
  const std::string field = FieldOf(status);
  if (field.empty()) return status;
  const absl::string_view message = status.message();
  const absl::string_view want =
      absl::StartsWith(message, field) ? message.substr(field.size() + 1) : message;
  return BadField(absl::StrCat(prefix, ".", field), want);
}

}  // namespace fuselink
