// The web-config parser (services/metrics/http/web_config.h, yaml_subset.h) on any bytes:
// it never reads outside them, it answers the same twice, an error names a line,
// and a parsed tree holds only lines that exist, each under a key.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "services/metrics/http/web_config.h"
#include "services/metrics/http/yaml_subset.h"
#include "tests/fuzz/fuzz_check.h"

namespace fuselink::services::http {
namespace {

void CheckTree(const YamlNode& node, int lines, int depth) {
  FL_FUZZ_CHECK(depth <= kMaxYamlDepth + 1);
  for (const YamlNode& child : node.children) {
    FL_FUZZ_CHECK(child.line >= 1 && child.line <= lines);
    FL_FUZZ_CHECK(!child.key.empty());
    FL_FUZZ_CHECK(child.is_mapping || child.children.empty());
    CheckTree(child, lines, depth + 1);
  }
}

}  // namespace
}  // namespace fuselink::services::http

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fuselink::services::http;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const int lines = static_cast<int>(std::count(text.begin(), text.end(), '\n')) + 1;
  const absl::StatusOr<YamlNode> tree = ParseYamlSubset(text);
  if (tree.ok()) {
    CheckTree(*tree, lines, 1);
  } else {
    FL_FUZZ_CHECK(tree.status().code() == absl::StatusCode::kInvalidArgument);
    FL_FUZZ_CHECK(absl::StartsWith(tree.status().message(), "web config"));
  }
  const absl::StatusOr<WebConfig> config = ParseWebConfig(text, "/base");
  const absl::StatusOr<WebConfig> again = ParseWebConfig(text, "/base");
  FL_FUZZ_CHECK(config.ok() == again.ok());
  FL_FUZZ_CHECK(!config.ok() || tree.ok());
  if (!config.ok()) {
    FL_FUZZ_CHECK(config.status() == again.status());
    FL_FUZZ_CHECK(absl::StartsWith(config.status().message(), "web config"));
    return 0;
  }
  if (config->tls.has_value()) {
    FL_FUZZ_CHECK(absl::StartsWith(config->tls->cert_file, "/"));
    FL_FUZZ_CHECK(absl::StartsWith(config->tls->key_file, "/"));
  }
  for (const auto& [user, hash] : config->basic_auth_users) {
    FL_FUZZ_CHECK(user.find(':') == std::string::npos);
    FL_FUZZ_CHECK(hash.size() == 60 && hash[0] == '$');
  }
  return 0;
}
