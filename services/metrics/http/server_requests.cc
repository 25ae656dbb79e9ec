// What the metrics server answers a request (the class: server_loop.h): its head
// parsed (400, 431), its credentials checked on the spot or parked for the bcrypt
// worker's verdict (401, 503), its route (/metrics 200, else 404 or 405), and the
// response queued for server_loop.cc to write.
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "services/metrics/http/server_loop.h"

namespace fuselink::services::http {
namespace {

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

}  // namespace

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

}  // namespace fuselink::services::http
