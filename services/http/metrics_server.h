// The HTTP/1.1 server of /metrics: one thread, non-blocking sockets and poll(2), so
// that no client can hold it. Each connection has a deadline for its request (TLS
// handshake included) and one for its response; a request head is bounded in bytes;
// past max_connections, the connection that has waited longest for its request is
// closed to make room (so a flood of idle or half-sent connections cannot lock a
// scrape out), and a new one is refused only while every other one is being
// answered. Optional TLS (OpenSSL, handshakes driven inside the poll loop) and HTTP
// basic auth come from a web config (web_config.h).
//
// GET (or HEAD) /metrics answers 200 with the text render() returns; any other path
// 404, any other method 405, a malformed request 400, an oversized head 431, missing
// or wrong credentials 401. Each refusal is reported to on_refusal.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "services/http/web_config.h"

namespace fuselink::services::http {

// Why the server refused a connection or a request (one metric label each).
enum class Refusal {
  kUnauthorized,        // 401: no credentials, or wrong ones
  kTimeout,             // a request, handshake or response past its deadline
  kOversize,            // 431: a request head over kMaxRequestHeadBytes
  kTooManyConnections,  // closed (or refused) past max_connections
  kMalformed,           // 400, 404 or 405
  kTls,                 // a TLS handshake or record that failed
};
inline constexpr int kRefusalKinds = 6;
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
  // From the request head to the last byte of the response written.
  absl::Duration response_timeout = absl::Seconds(10);
  // The body of GET /metrics. Called on the server's thread, one call at a time.
  std::function<std::string()> render;
  // Called on the server's thread for each refusal; may be empty.
  std::function<void(Refusal)> on_refusal;
};

class MetricsServer {
 public:
  // Binds, loads TLS files if configured, and starts the thread. UNAVAILABLE when
  // the address cannot be bound; INVALID_ARGUMENT for bad options or TLS files.
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
