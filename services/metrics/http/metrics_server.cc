#include "services/metrics/http/metrics_server.h"

#include <netdb.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/metrics/http/server_loop.h"
#include "services/metrics/http/tls_context.h"

namespace fuselink::services::http {
namespace {

inline constexpr int kListenBacklog = 128;

absl::Status Errno(absl::string_view call, const std::string& what) {
  return absl::UnavailableError(
      absl::StrCat(call, " ", what, ": ", std::strerror(errno)));
}

// "host:port", "[v6]:port" or ":port" into its parts.
absl::Status SplitListen(const std::string& listen, std::string* host,
                         std::string* port) {
  const size_t colon = listen.rfind(':');
  int number;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &number) || number < 0 ||
      number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics listen address '", listen, "' is not host:port"));
  }
  *host = listen.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  *port = listen.substr(colon + 1);
  return absl::OkStatus();
}

absl::StatusOr<int> Bind(const std::string& listen, int* port) {
  std::string host, service;
  if (absl::Status s = SplitListen(listen, &host, &service); !s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int e = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(),
                                &hints, &found);
      e != 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics listen address ", listen, ": ", gai_strerror(e)));
  }
  absl::Cleanup free_found = [found] { freeaddrinfo(found); };
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for ", listen));
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                          a->ai_protocol);
    if (fd < 0) {
      last = Errno("socket for", listen);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, kListenBacklog) != 0) {
      last = Errno("bind", listen);
      close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
    *port = ntohs(bound.ss_family == AF_INET6
                      ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                      : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return fd;
  }
  return last;
}

}  // namespace

absl::string_view RefusalName(Refusal refusal) {
  switch (refusal) {
    case Refusal::kUnauthorized:
      return "unauthorized";
    case Refusal::kTimeout:
      return "timeout";
    case Refusal::kOversize:
      return "oversize";
    case Refusal::kTooManyConnections:
      return "too_many_connections";
    case Refusal::kMalformed:
      return "malformed";
    case Refusal::kTls:
      return "tls";
    case Refusal::kAuthBusy:
      return "auth_busy";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    MetricsServerOptions options) {
  if (options.max_connections < 1) {
    return absl::InvalidArgumentError("metrics server: max_connections below 1");
  }
  std::unique_ptr<BasicAuth> auth;
  if (!options.web_config.basic_auth_users.empty()) {
    absl::StatusOr<std::unique_ptr<BasicAuth>> started =
        BasicAuth::Start(options.web_config.basic_auth_users, options.auth_queue_depth);
    if (!started.ok()) return started.status();
    auth = *std::move(started);
  }
  std::unique_ptr<TlsContext> tls;
  if (options.web_config.tls.has_value()) {
    absl::StatusOr<std::unique_ptr<TlsContext>> made =
        TlsContext::Create(*options.web_config.tls);
    if (!made.ok()) return made.status();
    tls = *std::move(made);
  }
  int port = 0;
  absl::StatusOr<int> listen_fd = Bind(options.listen, &port);
  if (!listen_fd.ok()) return listen_fd.status();
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    close(*listen_fd);
    return Errno("eventfd for", "the metrics server");
  }
  auto loop = std::make_unique<Loop>(std::move(options), *listen_fd, wake_fd,
                                     std::move(tls), std::move(auth));
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(loop), port, wake_fd));
}

MetricsServer::MetricsServer(std::unique_ptr<Loop> loop, int port, int wake_fd)
    : loop_(std::move(loop)), port_(port), wake_fd_(wake_fd) {
  thread_ = std::thread([this] { loop_->Run(); });
}

MetricsServer::~MetricsServer() {
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
    std::fprintf(stderr, "fuselink metrics server: cannot wake its thread: %s\n",
                 std::strerror(errno));
  }
  thread_.join();
  loop_.reset();
  close(wake_fd_);
}

}  // namespace fuselink::services::http
