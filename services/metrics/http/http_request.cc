#include "services/metrics/http/http_request.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fuselink::services::http {
namespace {

bool TokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         absl::string_view("!#$%&'*+-.^_`|~").find(c) != absl::string_view::npos;
}

bool Token(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!TokenChar(c)) return false;
  }
  return true;
}

bool HasToken(absl::string_view list, absl::string_view token) {
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(item), token)) return true;
  }
  return false;
}

}  // namespace

size_t RequestHeadEnd(absl::string_view buffer) {
  const size_t end = buffer.find("\r\n\r\n");
  return end == absl::string_view::npos ? end : end + 4;
}

absl::StatusOr<HttpRequest> ParseRequestHead(absl::string_view head) {
  if (!absl::EndsWith(head, "\r\n\r\n")) {
    return absl::InvalidArgumentError("request head does not end in a blank line");
  }
  head.remove_suffix(4);
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  if (static_cast<int>(lines.size()) - 1 > kMaxRequestHeaders) {
    return absl::InvalidArgumentError(
        absl::StrCat("more than ", kMaxRequestHeaders, " headers"));
  }
  std::vector<absl::string_view> start = absl::StrSplit(lines[0], ' ');
  if (start.size() != 3 || !Token(start[0]) || start[1].empty()) {
    return absl::InvalidArgumentError("request line is not 'METHOD TARGET VERSION'");
  }
  HttpRequest request;
  request.method = std::string(start[0]);
  if (start[1][0] != '/') return absl::InvalidArgumentError("target is not a path");
  for (char c : start[1]) {
    if (c <= 0x20 || c >= 0x7f)
      return absl::InvalidArgumentError("target holds a control byte");
  }
  request.path = std::string(start[1].substr(0, start[1].find('?')));
  bool http11;
  if (start[2] == "HTTP/1.1") {
    http11 = true;
  } else if (start[2] == "HTTP/1.0") {
    http11 = false;
  } else {
    return absl::InvalidArgumentError("version is not HTTP/1.0 or HTTP/1.1");
  }
  request.keep_alive = http11;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || !Token(line.substr(0, colon))) {
      return absl::InvalidArgumentError(
          absl::StrCat("header line ", i, " is not 'name: value'"));
    }
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    for (char c : value) {
      if ((c < 0x20 && c != '\t') || c == 0x7f) {
        return absl::InvalidArgumentError(
            absl::StrCat("header line ", i, " holds a control byte"));
      }
    }
    if (absl::EqualsIgnoreCase(name, "connection")) {
      if (HasToken(value, "close")) request.keep_alive = false;
      if (!http11 && HasToken(value, "keep-alive")) request.keep_alive = true;
    } else if (absl::EqualsIgnoreCase(name, "authorization")) {
      if (request.authorization.has_value()) {
        return absl::InvalidArgumentError("two Authorization headers");
      }
      request.authorization = std::string(value);
    } else if (absl::EqualsIgnoreCase(name, "transfer-encoding") ||
               (absl::EqualsIgnoreCase(name, "content-length") && value != "0")) {
      return absl::InvalidArgumentError("a request with a body");
    }
  }
  return request;
}

std::optional<BasicCredentials> ParseBasicAuth(absl::string_view authorization) {
  const size_t space = authorization.find(' ');
  if (space == absl::string_view::npos ||
      !absl::EqualsIgnoreCase(authorization.substr(0, space), "basic")) {
    return std::nullopt;
  }
  std::string decoded;
  if (!absl::Base64Unescape(absl::StripAsciiWhitespace(authorization.substr(space + 1)),
                            &decoded)) {
    return std::nullopt;
  }
  const size_t colon = decoded.find(':');
  if (colon == std::string::npos) return std::nullopt;
  return BasicCredentials{decoded.substr(0, colon), decoded.substr(colon + 1)};
}

}  // namespace fuselink::services::http
