// The HTTP/1.1 server of /metrics: one thread, non-blocking sockets and poll(2), so
// that no client can hold it. Each connection has a deadline for its request (TLS
// handshake included) and one for its response; a request head is bounded in bytes;
// past max_connections, the connection that has waited longest for its request is
// closed to make room (so a flood of idle or half-sent connections cannot lock a
// scrape out), and a new one is refused only while every other one is being
// answered. Optional TLS (OpenSSL, handshakes driven inside the poll loop) and HTTP
// basic auth come from a web config (web_config.h).
//
// Nothing slow runs on the thread. A TLS handshake is non-blocking: each step takes
// only the bytes already received, so a client that never sends its ClientHello (or
// stops inside it) is one idle descriptor until request_timeout; the handshake's
// own CPU (one signature, about a millisecond at RSA-2048) is bounded by the
// connections that reach that step, at most max_connections a round. bcrypt runs on
// BasicAuth's worker (basic_auth.h): a scraper's verified credentials are answered
// from a cache, others queue (at most auth_queue_depth) with the connection parked,
// and a full queue answers 503 at once.
//
// GET (or HEAD) /metrics answers 200 with the text render() returns; any other path
// 404, any other method 405, a malformed request 400, an oversized head 431, missing
// or wrong credentials 401, credentials that cannot be checked now (the bcrypt queue
// is full) 503 with Retry-After. Each refusal is reported to on_refusal.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "services/metrics/http/basic_auth.h"
#include "services/metrics/http/web_config.h"

namespace fuselink::services::http {

// Why the server refused a connection or a request (one metric label each).
enum class Refusal {
  kUnauthorized,        // 401: no credentials, or wrong ones
  kTimeout,             // a request, handshake or response past its deadline
  kOversize,            // 431: a request head over kMaxRequestHeadBytes
  kTooManyConnections,  // closed (or refused) past max_connections
  kMalformed,           // 400, 404 or 405
  kTls,                 // a TLS handshake or record that failed
  kAuthBusy,            // 503: credentials not checked, the bcrypt queue was full
};
inline constexpr int kRefusalKinds = 7;
absl::string_view RefusalName(Refusal refusal);

inline constexpr int kDefaultMaxConnections = 64;
// Each connection holds at most one request head (kMaxRequestHeadBytes) and one
// response: 64 of them stay well under a megabyte besides the responses.
static_assert(kDefaultMaxConnections >= 2, "a scrape needs room beside one stray client");

struct MetricsServerOptions {
  std::string listen;    // "host:port", "[v6]:port" or ":port"; port 0: the kernel picks
  WebConfig web_config;  // default: plain HTTP, no auth
  int max_connections = kDefaultMaxConnections;
  // From accept (or the previous response on a kept-alive connection) to a
  // complete request head.
  absl::Duration request_timeout = absl::Seconds(5);
  // From the request head to the last byte of the response written (a bcrypt
  // check included).
  absl::Duration response_timeout = absl::Seconds(10);
  // Basic-auth checks outstanding on the bcrypt worker, at most (basic_auth.h).
  int auth_queue_depth = kDefaultAuthQueueDepth;
  // The body of GET /metrics. Called on the server's thread, one call at a time.
  std::function<std::string()> render;
  // Called on the server's thread for each refusal; may be empty.
  std::function<void(Refusal)> on_refusal;
};

class MetricsServer {
 public:
  // Binds, loads TLS files if configured, and starts the thread (and the bcrypt
  // worker, with basic auth). UNAVAILABLE when the address cannot be bound;
  // INVALID_ARGUMENT for bad options or TLS files.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      MetricsServerOptions options);
  // Stops the thread and closes every connection.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

 private:
  class Loop;
  MetricsServer(std::unique_ptr<Loop> loop, int port, int wake_fd);

  std::unique_ptr<Loop> loop_;  // owned by thread_ while it runs
  const int port_;
  const int wake_fd_;  // eventfd: written once to stop the thread
  std::thread thread_;
};

}  // namespace fuselink::services::http
