#include "services/metrics/http/metrics_server.h"

#include <netdb.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/metrics/http/http_request.h"
#include "services/metrics/http/tls_context.h"

namespace fuselink::services::http {
namespace {

inline constexpr int kListenBacklog = 128;
// Connections taken from the listening socket per poll round, so that a flood of
// new connections cannot starve the ones already open.
inline constexpr int kMaxAcceptsPerRound = 64;
// After a response that closes the connection: how long, and how many bytes, the
// rest of the client's request is read and dropped, so that the kernel does not
// reset the connection before the client reads the response.
inline constexpr absl::Duration kLingerTimeout = absl::Seconds(1);
inline constexpr size_t kMaxLingerBytes = 64 * 1024;
inline constexpr size_t kReadChunkBytes = 4096;
static_assert(kReadChunkBytes <= kMaxRequestHeadBytes, "one read stays near the bound");

struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};

enum class Phase {
  kHandshake,    // TLS only
  kReading,      // waiting for a complete request head
  kAuthorizing,  // the request's credentials on the bcrypt worker; nothing polled
  kWriting,      // a response queued
  kLingering,    // response sent; dropping what the client still sends, then close
};

struct Connection {
  uint64_t id = 0;  // unique in the server's life: the bcrypt worker's ticket
  int fd = -1;
  std::unique_ptr<SSL, SslFree> ssl;  // null: plain HTTP
  Phase phase = Phase::kReading;
  short events = POLLIN;  // what poll waits for (TLS may want the other direction)
  std::string in;         // bytes of the next request(s), at most a head and a chunk
  std::string out;        // the response being written
  size_t out_sent = 0;
  bool close_after = false;  // close once `out` is written
  int served = 0;            // responses written
  size_t lingered_bytes = 0;
  HttpRequest authorizing;  // the request waiting in kAuthorizing
  absl::Time deadline;
  absl::Time active;  // last accept or response: the eviction order
  bool closed = false;
  // A pipelined request may be buffered already: served on the next round of the
  // loop, one request per connection per round, never by recursion.
  bool pending = false;
};

const char* StatusText(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

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

// Everything the server's thread owns. Nothing here is shared: the only way in from
// other threads is the wake eventfd.
class MetricsServer::Loop {
 public:
  Loop(MetricsServerOptions options, int listen_fd, int wake_fd,
       std::unique_ptr<TlsContext> tls, std::unique_ptr<BasicAuth> auth)
      : options_(std::move(options)),
        listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        tls_(std::move(tls)),
        auth_(std::move(auth)) {}
  ~Loop() {
    for (Connection& c : connections_) Close(c);
    close(listen_fd_);
  }

  void Run();

 private:
  void Refuse(Refusal refusal) {
    if (options_.on_refusal) options_.on_refusal(refusal);
  }
  void Accept(absl::Time now);
  void Drive(Connection& c, short revents, absl::Time now);
  void Handshake(Connection& c, absl::Time now);
  void Read(Connection& c, absl::Time now);
  void Linger(Connection& c, absl::Time now);
  void TakeRequest(Connection& c, absl::Time now);
  // The verdicts of the bcrypt worker: each waiting connection answered.
  void TakeVerdicts(absl::Time now);
  void Unauthorized(Connection& c, const HttpRequest& request, absl::Time now);
  // Answers an authorized request: /metrics, or 404 / 405.
  void Route(Connection& c, const HttpRequest& request, absl::Time now);
  void Respond(Connection& c, int code, const std::string& body, bool head_only,
               absl::string_view extra_headers, absl::Time now);
  void Write(Connection& c, absl::Time now);
  void Finish(Connection& c, absl::Time now);
  // One TLS call's outcome: true to go on; false when it wants I/O (events set) or
  // failed (connection closed, refusal counted when `count`).
  bool TlsWants(Connection& c, int result, bool count);
  void Close(Connection& c) {
    if (c.closed) return;
    if (c.phase == Phase::kAuthorizing) auth_->Cancel(c.id);
    c.ssl.reset();
    close(c.fd);
    c.closed = true;
  }

  const MetricsServerOptions options_;
  const int listen_fd_;
  const int wake_fd_;
  const std::unique_ptr<TlsContext> tls_;  // null: plain HTTP
  const std::unique_ptr<BasicAuth> auth_;  // null: no basic auth
  std::deque<Connection> connections_;     // at most max_connections
  uint64_t next_id_ = 1;
};

void MetricsServer::Loop::Run() {
  // A peer that goes while its response is written would raise SIGPIPE inside
  // OpenSSL's write(2); blocked on this thread, the write returns EPIPE instead.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  std::vector<pollfd> fds;
  for (;;) {
    absl::Time now = absl::Now();
    absl::Time next = now + absl::Seconds(1);
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    fds.push_back({auth_ ? auth_->ready_fd() : -1, POLLIN, 0});  // -1: not polled
    constexpr size_t kFirst = 3;  // connections' entries follow
    for (Connection& c : connections_) {
      fds.push_back({c.fd, c.events, 0});
      next = std::min(next, c.pending ? now : c.deadline);
    }
    const int timeout_ms =
        static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(next - now) + 1));
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      std::fprintf(stderr, "fuselink metrics server: poll: %s\n", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    now = absl::Now();
    if (fds[2].revents != 0) TakeVerdicts(now);
    for (size_t i = 0; i < connections_.size(); ++i) {
      Connection& c = connections_[i];
      if (fds[i + kFirst].revents != 0) {
        Drive(c, fds[i + kFirst].revents, now);
      } else if (c.pending && c.phase == Phase::kReading) {
        c.pending = false;
        Read(c, now);
      }
      if (c.closed || now < c.deadline) continue;
      // Quietly: a kept-alive connection waiting for its next scrape, or a lingering
      // close. Counted: a request, handshake or response that did not finish.
      const bool idle = c.phase == Phase::kReading && c.in.empty() && c.served > 0;
      if (!idle && c.phase != Phase::kLingering) Refuse(Refusal::kTimeout);
      Close(c);
    }
    std::erase_if(connections_, [](const Connection& c) { return c.closed; });
    if (fds[1].revents != 0) Accept(now);
  }
}

void MetricsServer::Loop::Accept(absl::Time now) {
  for (int n = 0; n < kMaxAcceptsPerRound; ++n) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
          errno != ECONNABORTED) {
        std::fprintf(stderr, "fuselink metrics server: accept: %s\n",
                     std::strerror(errno));
      }
      return;
    }
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      // Room for the new one: close the connection that has waited longest without
      // a response in progress; else the oldest one still being answered.
      auto oldest = connections_.end();
      for (auto it = connections_.begin(); it != connections_.end(); ++it) {
        if ((it->phase == Phase::kReading || it->phase == Phase::kHandshake ||
             it->phase == Phase::kLingering) &&
            (oldest == connections_.end() || it->active < oldest->active)) {
          oldest = it;
        }
      }
      // Else the oldest client that does not read its response (or waits for its
      // credentials' check): either waits at most response_timeout anyway.
      if (oldest == connections_.end()) {
        for (auto it = connections_.begin(); it != connections_.end(); ++it) {
          if ((it->phase == Phase::kWriting || it->phase == Phase::kAuthorizing) &&
              (oldest == connections_.end() || it->active < oldest->active)) {
            oldest = it;
          }
        }
      }
      Refuse(Refusal::kTooManyConnections);
      if (oldest == connections_.end()) {
        close(fd);
        continue;
      }
      Close(*oldest);
      connections_.erase(oldest);
    }
    Connection& c = connections_.emplace_back();
    c.id = next_id_++;
    c.fd = fd;
    c.active = now;
    c.deadline = now + options_.request_timeout;
    if (tls_ != nullptr) {
      c.ssl.reset(SSL_new(tls_->Current(now)));
      if (c.ssl == nullptr || SSL_set_fd(c.ssl.get(), fd) != 1) {
        Refuse(Refusal::kTls);
        Close(c);
        connections_.pop_back();
        continue;
      }
      SSL_set_accept_state(c.ssl.get());
      c.phase = Phase::kHandshake;
    }
  }
}

void MetricsServer::Loop::Drive(Connection& c, short revents, absl::Time now) {
  if ((revents & POLLNVAL) != 0) {
    Close(c);
    return;
  }
  switch (c.phase) {
    case Phase::kHandshake:
      Handshake(c, now);
      break;
    case Phase::kReading:
      Read(c, now);
      break;
    case Phase::kWriting:
      Write(c, now);
      break;
    case Phase::kLingering:
      Linger(c, now);
      break;
    case Phase::kAuthorizing:  // nothing polled: the client hung up or failed
      Close(c);
      break;
  }
}

bool MetricsServer::Loop::TlsWants(Connection& c, int result, bool count) {
  switch (SSL_get_error(c.ssl.get(), result)) {
    case SSL_ERROR_WANT_READ:
      c.events = POLLIN;
      return false;
    case SSL_ERROR_WANT_WRITE:
      c.events = POLLOUT;
      return false;
    case SSL_ERROR_ZERO_RETURN:
      Close(c);
      return false;
    default:
      if (count) Refuse(Refusal::kTls);
      Close(c);
      return false;
  }
}

void MetricsServer::Loop::Handshake(Connection& c, absl::Time now) {
  const int result = SSL_do_handshake(c.ssl.get());
  if (result != 1) {
    TlsWants(c, result, /*count=*/true);
    return;
  }
  c.phase = Phase::kReading;
  c.events = POLLIN;
  Read(c, now);  // the request may have come with the handshake's last flight
}

void MetricsServer::Loop::Read(Connection& c, absl::Time now) {
  char chunk[kReadChunkBytes];
  // Read no further than one head past the bound: enough to tell it is oversized.
  while (!c.closed && c.in.size() <= kMaxRequestHeadBytes) {
    ssize_t got;
    if (c.ssl != nullptr) {
      got = SSL_read(c.ssl.get(), chunk, sizeof(chunk));
      if (got <= 0) {
        TlsWants(c, static_cast<int>(got), /*count=*/false);
        break;
      }
    } else {
      got = recv(c.fd, chunk, sizeof(chunk), 0);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
      if (got <= 0) {
        Close(c);  // the client went (or reset)
        break;
      }
    }
    c.in.append(chunk, static_cast<size_t>(got));
  }
  if (!c.closed) TakeRequest(c, now);
}

void MetricsServer::Loop::TakeRequest(Connection& c, absl::Time now) {
  const size_t end = RequestHeadEnd(c.in);
  if (end == absl::string_view::npos || end > kMaxRequestHeadBytes) {
    if (c.in.size() > kMaxRequestHeadBytes) {
      Refuse(Refusal::kOversize);
      c.close_after = true;
      Respond(c, 431, "request head too large\n", false, "", now);
    }
    return;
  }
  absl::StatusOr<HttpRequest> request =
      ParseRequestHead(absl::string_view(c.in).substr(0, end));
  c.in.erase(0, end);
  if (!request.ok()) {
    Refuse(Refusal::kMalformed);
    c.close_after = true;
    Respond(c, 400, absl::StrCat(request.status().message(), "\n"), false, "", now);
    return;
  }
  c.close_after = !request->keep_alive;
  if (auth_ != nullptr) {
    switch (auth_->Check(request->authorization, c.id)) {
      case BasicAuth::Verdict::kAllowed:
        break;
      case BasicAuth::Verdict::kDenied:
        Unauthorized(c, *request, now);
        return;
      case BasicAuth::Verdict::kBusy:
        Refuse(Refusal::kAuthBusy);
        c.close_after = true;
        Respond(c, 503, "too many credentials being checked; try again\n",
                request->method == "HEAD", "Retry-After: 1\r\n", now);
        return;
      case BasicAuth::Verdict::kPending:  // TakeVerdicts goes on
        c.phase = Phase::kAuthorizing;
        c.events = 0;
        c.deadline = now + options_.response_timeout;
        c.authorizing = *std::move(request);
        return;
    }
  }
  Route(c, *request, now);
}

void MetricsServer::Loop::TakeVerdicts(absl::Time now) {
  for (const BasicAuth::Done& done : auth_->TakeDone()) {
    // Linear: at most max_connections. Absent: closed (timed out or evicted).
    for (Connection& c : connections_) {
      if (c.id != done.ticket || c.closed || c.phase != Phase::kAuthorizing) continue;
      c.phase = Phase::kReading;  // no longer waiting: Close must not cancel
      const HttpRequest request = std::move(c.authorizing);
      if (done.allowed) {
        Route(c, request, now);
      } else {
        Unauthorized(c, request, now);
      }
      break;
    }
  }
}

void MetricsServer::Loop::Unauthorized(Connection& c, const HttpRequest& request,
                                       absl::Time now) {
  Refuse(Refusal::kUnauthorized);
  c.close_after = true;  // one guess per connection
  Respond(c, 401, "unauthorized\n", request.method == "HEAD",
          "WWW-Authenticate: Basic realm=\"fuselink metrics\"\r\n", now);
}

void MetricsServer::Loop::Route(Connection& c, const HttpRequest& request,
                                absl::Time now) {
  const bool head_only = request.method == "HEAD";
  if (request.path != "/metrics") {
    Refuse(Refusal::kMalformed);
    Respond(c, 404, "only /metrics is served here\n", head_only, "", now);
    return;
  }
  if (request.method != "GET" && !head_only) {
    Refuse(Refusal::kMalformed);
    Respond(c, 405, "only GET and HEAD\n", false, "Allow: GET, HEAD\r\n", now);
    return;
  }
  Respond(c, 200, options_.render ? options_.render() : std::string(), head_only,
          "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n", now);
}

void MetricsServer::Loop::Respond(Connection& c, int code, const std::string& body,
                                  bool head_only, absl::string_view extra_headers,
                                  absl::Time now) {
  c.out = absl::StrCat("HTTP/1.1 ", code, " ", StatusText(code), "\r\n", extra_headers,
                       code == 200 ? "" : "Content-Type: text/plain; charset=utf-8\r\n",
                       "Content-Length: ", body.size(),
                       "\r\nConnection: ", c.close_after ? "close" : "keep-alive",
                       "\r\n\r\n");
  if (!head_only) c.out += body;
  c.out_sent = 0;
  c.phase = Phase::kWriting;
  c.events = POLLOUT;
  c.deadline = now + options_.response_timeout;
  Write(c, now);
}

void MetricsServer::Loop::Write(Connection& c, absl::Time now) {
  while (c.out_sent < c.out.size()) {
    const char* data = c.out.data() + c.out_sent;
    const size_t left = c.out.size() - c.out_sent;
    if (c.ssl != nullptr) {
      const int wrote =
          SSL_write(c.ssl.get(), data, static_cast<int>(std::min<size_t>(left, 1 << 20)));
      if (wrote <= 0) {
        TlsWants(c, wrote, /*count=*/false);
        return;
      }
      c.out_sent += static_cast<size_t>(wrote);
    } else {
      const ssize_t wrote = send(c.fd, data, left, MSG_NOSIGNAL);
      if (wrote < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        c.events = POLLOUT;
        return;
      }
      if (wrote < 0) {
        Close(c);
        return;
      }
      c.out_sent += static_cast<size_t>(wrote);
    }
  }
  Finish(c, now);
}

void MetricsServer::Loop::Finish(Connection& c, absl::Time now) {
  ++c.served;
  c.out.clear();
  c.out.shrink_to_fit();
  c.active = now;
  if (c.close_after) {
    if (c.ssl != nullptr) SSL_shutdown(c.ssl.get());  // close_notify, not awaited
    shutdown(c.fd, SHUT_WR);
    c.phase = Phase::kLingering;
    c.events = POLLIN;
    c.deadline = now + kLingerTimeout;
    return;
  }
  c.phase = Phase::kReading;
  c.events = POLLIN;
  c.deadline = now + options_.request_timeout;
  // A pipelined request may already be here (or, for TLS, inside OpenSSL's buffer):
  // the loop serves it next round.
  c.pending = !c.in.empty() || (c.ssl != nullptr && SSL_pending(c.ssl.get()) > 0);
}

void MetricsServer::Loop::Linger(Connection& c, absl::Time now) {
  char chunk[kReadChunkBytes];
  for (;;) {
    const ssize_t got = recv(c.fd, chunk, sizeof(chunk), 0);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    c.lingered_bytes += got > 0 ? static_cast<size_t>(got) : 0;
    if (got <= 0 || c.lingered_bytes > kMaxLingerBytes) {
      Close(c);
      return;
    }
  }
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
