// The head of one HTTP/1.x request, as the metrics server reads it. Pure: no
// sockets, so that every malformed head can be unit-tested and fuzzed.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fuselink::services::http {

// Bounds on what a scrape sends: Prometheus' request head is under 300 bytes.
inline constexpr size_t kMaxRequestHeadBytes = 8 * 1024;
inline constexpr int kMaxRequestHeaders = 64;

struct HttpRequest {
  std::string method;
  std::string path;         // the target up to '?'
  bool keep_alive = false;  // HTTP/1.1 unless "Connection: close"; 1.0 if asked
  std::optional<std::string> authorization;  // the header's value, when sent
};

// Where the head of the request at the start of `buffer` ends (just past its blank
// line), or npos while it is incomplete.
size_t RequestHeadEnd(absl::string_view buffer);

// Parses a complete head (RequestHeadEnd's bytes). INVALID_ARGUMENT for anything
// that is not an HTTP/1.0 or 1.1 request without a body.
absl::StatusOr<HttpRequest> ParseRequestHead(absl::string_view head);

// The user and password of a "Basic ..." Authorization value, or nullopt.
struct BasicCredentials {
  std::string user;
  std::string password;
};
std::optional<BasicCredentials> ParseBasicAuth(absl::string_view authorization);

}  // namespace fuselink::services::http
