// The YAML subset a Prometheus web-config file needs, and nothing more: nested block
// mappings of keys to plain, 'single' or "double" quoted scalars, with # comments.
// Anything else (sequences, flow collections, anchors, tags, multi-line or block
// scalars, documents, tabs in indentation, duplicate keys) is refused with an
// INVALID_ARGUMENT that names its line, so that a file never means something other
// than what it says.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fuselink::services::http {

// Bounds on the input: a web-config file is a few hundred bytes.
inline constexpr size_t kMaxYamlBytes = 64 * 1024;
inline constexpr int kMaxYamlDepth = 8;  // nesting levels of mappings

// One key of a mapping and what it maps to: a scalar, or (is_mapping) a nested
// mapping. `key:` with nothing indented under it is an empty mapping.
struct YamlNode {
  std::string key;
  int line = 0;  // 1-based line of the key
  bool is_mapping = false;
  std::string scalar;              // when !is_mapping
  std::vector<YamlNode> children;  // when is_mapping, in file order

  // The child named `name`, or nullptr.
  const YamlNode* Find(absl::string_view name) const;
};

// Parses `text` into its top-level mapping (a node with key "" and line 0).
absl::StatusOr<YamlNode> ParseYamlSubset(absl::string_view text);

}  // namespace fuselink::services::http
