// The metrics server's loop, shared by its three files: metrics_server.cc (the
// listening socket, the thread, start and stop), server_loop.cc (the poll loop and
// each connection's bytes: accept, eviction, TLS handshake, read, write, linger) and
// server_requests.cc (what a request is answered: its head parsed, its credentials
// checked, its route, the response). Internal to fuselink_metrics_http; callers use
// metrics_server.h.
//
// Thread contract: everything here belongs to the server's one thread.
#pragma once

#include <openssl/ssl.h>
#include <poll.h>
#include <unistd.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "services/metrics/http/basic_auth.h"
#include "services/metrics/http/http_request.h"
#include "services/metrics/http/metrics_server.h"
#include "services/metrics/http/tls_context.h"

namespace fuselink::services::http {
namespace server_internal {

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

}  // namespace server_internal

// Everything the server's thread owns. Nothing here is shared: the only way in from
// other threads is the wake eventfd.
class MetricsServer::Loop {
  using Connection = server_internal::Connection;
  using Phase = server_internal::Phase;

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

}  // namespace fuselink::services::http
