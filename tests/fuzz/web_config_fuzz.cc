// The web-config parser (services/metrics/http/web_config.h, strict_yaml.h: libyaml
// under our rules) on any bytes: it never reads outside them, it answers the same
// twice, an error names a line of the input, and a parsed tree holds only lines that
// exist, each under a key, no deeper than kMaxYamlDepth. libyaml itself is the
// system's build, not instrumented: coverage guides the fuzzer through our rules and
// reaches libyaml's paths only through the events they see.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "services/metrics/http/strict_yaml.h"
#include "services/metrics/http/web_config.h"
#include "tests/fuzz/fuzz_check.h"

namespace fuselink::services::http {
namespace {

// Lines as libyaml counts them: YAML 1.1 also breaks at NEL, LS and PS.
int Lines(absl::string_view text) {
  int lines = 1 + static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  for (absl::string_view other : {"\xc2\x85", "\xe2\x80\xa8", "\xe2\x80\xa9"}) {
    for (size_t at = text.find(other); at != absl::string_view::npos;
         at = text.find(other, at + 1)) {
      ++lines;
    }
  }
  return lines;
}

void CheckTree(const YamlNode& node, int lines, int depth) {
  FL_FUZZ_CHECK(depth <= kMaxYamlDepth + 1);
  for (const YamlNode& child : node.children) {
    FL_FUZZ_CHECK(child.line >= 1 && child.line <= lines);
    FL_FUZZ_CHECK(!child.key.empty());
    FL_FUZZ_CHECK(child.is_mapping || child.children.empty());
    CheckTree(child, lines, depth + 1);
  }
}

// "web config line N: ..." with N a line of the input, or "web config: ..." (size).
void CheckError(const absl::Status& status, int lines) {
  absl::string_view message = status.message();
  if (absl::ConsumePrefix(&message, "web config line ")) {
    int line = 0;
    FL_FUZZ_CHECK(absl::SimpleAtoi(message.substr(0, message.find(':')), &line));
    FL_FUZZ_CHECK(line >= 1 && line <= lines);
  } else {
    FL_FUZZ_CHECK(absl::StartsWith(message, "web config: "));
  }
}

}  // namespace
}  // namespace fuselink::services::http

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fuselink::services::http;
  const std::string text(reinterpret_cast<const char*>(data), size);
  const int lines = Lines(text);
  const absl::StatusOr<YamlNode> tree = ParseStrictYaml(text);
  if (tree.ok()) {
    CheckTree(*tree, lines, 1);
  } else {
    FL_FUZZ_CHECK(tree.status().code() == absl::StatusCode::kInvalidArgument);
    CheckError(tree.status(), lines);
  }
  const absl::StatusOr<WebConfig> config = ParseWebConfig(text, "/base");
  const absl::StatusOr<WebConfig> again = ParseWebConfig(text, "/base");
  FL_FUZZ_CHECK(config.ok() == again.ok());
  FL_FUZZ_CHECK(!config.ok() || tree.ok());
  if (!config.ok()) {
    FL_FUZZ_CHECK(config.status() == again.status());
    CheckError(config.status(), lines);
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
