// The YAML a Prometheus web-config file is written in, read by libyaml and held to
// what such a file needs: nested block mappings of keys to scalars (plain, 'single'
// or "double" quoted, each on one line), with # comments. libyaml does the YAML;
// this layer refuses, naming the line, every construct by which a file could mean
// something other than what a reader sees in it: sequences, flow collections,
// anchors and aliases, tags, block and multi-line scalars, document markers and
// directives, duplicate keys, non-ASCII or control characters outside quotes, an
// indented first key, nesting past kMaxYamlDepth. A YAML syntax error is refused
// with libyaml's own words and line.
//
// Every error is INVALID_ARGUMENT (RESOURCE_EXHAUSTED only if libyaml cannot
// allocate) and its message starts "web config line N: " (or "web config: " for
// an oversized file). Pure; any thread.
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
// mapping. `key:` with nothing after it (an empty plain scalar in YAML) is an empty
// mapping.
struct YamlNode {
  std::string key;
  int line = 0;  // 1-based line of the key
  bool is_mapping = false;
  std::string scalar;              // when !is_mapping
  std::vector<YamlNode> children;  // when is_mapping, in file order

  // The child named `name`, or nullptr.
  const YamlNode* Find(absl::string_view name) const;
};

// Parses `text` into its top-level mapping (a node with key "" and line 0); an
// empty file (or comments only) is an empty mapping.
absl::StatusOr<YamlNode> ParseStrictYaml(absl::string_view text);

}  // namespace fuselink::services::http
