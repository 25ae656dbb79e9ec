// Text as a JSON string, for the few lines of JSON fuselink writes by hand (the ready
// file, the benchmark reports): no JSON library is worth it for a flat object.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace fuselink {

// `text` as a JSON string, quotes included: '"' and '\' escaped, control characters
// as \uXXXX (\n, \t and the like by their short forms). Bytes >= 0x80 pass as they
// are: a UTF-8 name stays UTF-8.
std::string JsonQuoted(absl::string_view text);

}  // namespace fuselink
