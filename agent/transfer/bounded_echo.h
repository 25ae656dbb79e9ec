// Client strings quoted in error messages (request ids, tensor and node names) are
// cut to kMaxEchoBytes, so that a message never grows with what a client sent.
// A local helper until agent/common/status_macros.h has the shared one.
#pragma once

#include <cstddef>

#include "absl/strings/string_view.h"

namespace fuselink::transfer {

inline constexpr size_t kMaxEchoBytes = 64;

inline absl::string_view Echo(absl::string_view client_string) {
  return client_string.substr(0, kMaxEchoBytes);
}

}  // namespace fuselink::transfer
