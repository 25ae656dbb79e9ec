#include "tests/integration/net_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"

namespace fuselink::testing {
namespace {

constexpr int kIoTimeoutMs = 10000;

absl::StatusOr<sockaddr_in> Address(const std::string& host, uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", host));
  }
  return addr;
}

}  // namespace

absl::StatusOr<UniqueFd> TcpConnect(const std::string& host, uint16_t port) {
  FL_ASSIGN_OR_RETURN(sockaddr_in addr, Address(host, port));
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  timeval tv{.tv_sec = kIoTimeoutMs / 1000, .tv_usec = 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(absl::StrCat("connect(", host, ":", port, ")"), errno);
  }
  return fd;
}

absl::StatusOr<std::string> HttpGet(const std::string& url) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(absl::StrCat("not an http URL: ", url));
  }
  const size_t slash = rest.find('/');
  const std::string path(slash == absl::string_view::npos ? "/" : rest.substr(slash));
  const absl::string_view host_port = rest.substr(0, slash);
  const size_t colon = host_port.rfind(':');
  uint32_t port = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("no port in ", url));
  }
  const std::string host(host_port.substr(0, colon));
  FL_ASSIGN_OR_RETURN(UniqueFd fd, TcpConnect(host, static_cast<uint16_t>(port)));
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port,
                                           "\r\nConnection: close\r\n\r\n");
  if (send(fd.get(), request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return ErrnoStatus("send(HTTP request)", errno);
  }
  std::string response;
  char buffer[16384];
  while (true) {
    const ssize_t n = recv(fd.get(), buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("recv(HTTP response)", errno);
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || body == std::string::npos ||
      response.substr(9, 3) != "200") {
    return absl::UnavailableError(
        absl::StrCat("GET ", url, ": bad response: ", response.substr(0, 200)));
  }
  return response.substr(body + 4);
}

absl::StatusOr<double> MetricValue(absl::string_view exposition, absl::string_view name,
                                   absl::string_view label) {
  double sum = 0;
  bool found = false;
  for (absl::string_view line : absl::StrSplit(exposition, '\n', absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&line, name)) continue;
    absl::string_view labels;
    if (absl::ConsumePrefix(&line, "{")) {
      const size_t close = line.find('}');
      if (close == absl::string_view::npos) continue;
      labels = line.substr(0, close);
      line.remove_prefix(close + 1);
    }
    if (!absl::ConsumePrefix(&line, " ")) continue;  // a longer name
    if (!label.empty() && !absl::StrContains(labels, label)) continue;
    double value = 0;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.empty() || !absl::SimpleAtod(fields[0], &value)) continue;
    sum += value;
    found = true;
  }
  if (!found) {
    return absl::NotFoundError(absl::StrCat("no sample of ", name, " {", label, "}"));
  }
  return sum;
}

bool WaitUntilClosed(int fd, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  char buffer[4096];
  while (absl::Now() < give_up) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    const int ready = poll(&p, 1, 50);
    if (ready <= 0) continue;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

absl::StatusOr<UniqueFd> ReserveClosedPort(uint16_t* port) {
  FL_ASSIGN_OR_RETURN(sockaddr_in addr, Address("127.0.0.1", 0));
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus("bind(127.0.0.1:0)", errno);
  }
  socklen_t len = sizeof(addr);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return ErrnoStatus("getsockname", errno);
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace fuselink::testing
