// The ready file (--ready_file): one line of JSON an agent writes once it serves, so
// that a script or a test harness that started it learns where without parsing its
// log. Its keys, all strings: "node", "grpc" (host:port), "metrics" (the URL) and
// "handle_socket" (the path). Written whole, then renamed into place, so that a reader
// that sees the file sees all of it. clients/cpp's ReadyField reads it back.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace fuselink::services {

struct ReadyInfo {
  std::string node;
  std::string grpc_address;   // host:port
  std::string metrics_url;    // http(s)://host:port/metrics
  std::string handle_socket;  // a path
};

// The file's line (each value JsonQuoted, agent/common/json.h):
// {"node":...,"grpc":...,"metrics":...,"handle_socket":...} and a
// newline, no spaces.
std::string ReadyJson(const ReadyInfo& info);

// Writes ReadyJson(info) to `path` + ".tmp" and renames it to `path`. The errno of a
// failed write or rename as a status.
absl::Status WriteReadyFile(const std::string& path, const ReadyInfo& info);

}  // namespace fuselink::services
