#include "clients/cpp/scrape.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/common/unique_fd.h"

namespace fuselink::client {

absl::StatusOr<std::string> HttpGet(const std::string& url, absl::Duration timeout) {
  constexpr absl::string_view kScheme = "http://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(absl::StrCat("not an http:// URL: ", url));
  }
  const std::string rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  const std::string hostport = rest.substr(0, slash);
  const std::string path = slash == std::string::npos ? "/" : rest.substr(slash);
  const size_t colon = hostport.rfind(':');
  const std::string host = hostport.substr(0, colon);
  const std::string port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", hostport));
  }
  UniqueFd fd(socket(found->ai_family, found->ai_socktype, found->ai_protocol));
  const timeval tv = absl::ToTimeval(timeout);
  const bool connected =
      fd.get() >= 0 &&
      setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0 &&
      setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0 &&
      connect(fd.get(), found->ai_addr, found->ai_addrlen) == 0;
  freeaddrinfo(found);
  if (!connected) {
    return absl::UnavailableError(
        absl::StrCat("connect to ", hostport, ": ", std::strerror(errno)));
  }
  const std::string get = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", hostport,
                                       "\r\nConnection: close\r\n\r\n");
  if (send(fd.get(), get.data(), get.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(get.size())) {
    return absl::UnavailableError(absl::StrCat("send to ", hostport));
  }
  std::string response;
  char buffer[16384];
  for (;;) {
    const ssize_t n = recv(fd.get(), buffer, sizeof buffer, 0);
    if (n == 0) break;
    if (n < 0) return absl::UnavailableError(absl::StrCat("read from ", hostport));
    response.append(buffer, n);
  }
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || body == std::string::npos ||
      response.find(" 200 ") > body) {
    return absl::UnavailableError(absl::StrCat("no 200 answer from ", url));
  }
  return response.substr(body + 4);
}

absl::StatusOr<double> MetricValue(const std::string& body, const std::string& name,
                                   const std::map<std::string, std::string>& labels) {
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::StartsWith(line, name)) continue;
    const absl::string_view rest = line.substr(name.size());
    if (rest.empty() || (rest[0] != '{' && rest[0] != ' ')) continue;
    bool all = true;
    for (const auto& [key, value] : labels) {
      all = all && absl::StrContains(rest, absl::StrCat(key, "=\"", value, "\""));
    }
    if (!all) continue;
    const size_t space = rest.rfind(' ');
    double v = 0;
    if (space != absl::string_view::npos &&
        absl::SimpleAtod(rest.substr(space + 1), &v)) {
      return v;
    }
  }
  return absl::NotFoundError(absl::StrCat("no sample of ", name));
}

}  // namespace fuselink::client
