// The metrics server's poll loop and each connection's bytes (the class:
// server_loop.h): accept and eviction past max_connections, the TLS handshake,
// reading a request head, writing a response, and the linger before a close. What a
// request is answered is server_requests.cc's.
#include "services/metrics/http/server_loop.h"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "agent/common/check.h"

namespace fuselink::services::http {
namespace {

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

}  // namespace

void MetricsServer::Loop::Run() {
  NameThisThread("fl-metrics");
  SetThreadRole(ThreadRole::kPollLoop);  // bcrypt goes to fl-basic-auth (basic_auth.h)
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

}  // namespace fuselink::services::http
