#include "agent/fabric/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"

namespace fuselink::fabric {
namespace {

absl::Status SetOption(int fd, int level, int name, int value, absl::string_view call) {
  if (setsockopt(fd, level, name, &value, sizeof(value)) != 0) {
    return ErrnoStatus(call, errno);
  }
  return absl::OkStatus();
}

absl::Status SetBuffers(int fd) {
  FL_RETURN_IF_ERROR(
      SetOption(fd, SOL_SOCKET, SO_SNDBUF, kSocketBufferBytes, "setsockopt(SO_SNDBUF)"));
  return SetOption(fd, SOL_SOCKET, SO_RCVBUF, kSocketBufferBytes,
                   "setsockopt(SO_RCVBUF)");
}

absl::StatusOr<UniqueFd> NewTcpSocket(const SocketAddress& address) {
  UniqueFd fd(socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  return fd;
}

absl::Status SetBlocking(int fd, bool blocking) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return ErrnoStatus("fcntl(F_GETFL)", errno);
  flags = blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) != 0) return ErrnoStatus("fcntl(F_SETFL)", errno);
  return absl::OkStatus();
}

// Waits for a non-blocking connect() to finish.
absl::Status AwaitConnect(int fd, int timeout_ms) {
  pollfd waiting{.fd = fd, .events = POLLOUT, .revents = 0};
  int ready;
  do {
    ready = poll(&waiting, 1, timeout_ms);
  } while (ready < 0 && errno == EINTR);
  if (ready < 0) return ErrnoStatus("poll", errno);
  if (ready == 0) return ErrnoStatus("connect", ETIMEDOUT);
  int error = 0;
  socklen_t length = sizeof(error);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) {
    return ErrnoStatus("getsockopt(SO_ERROR)", errno);
  }
  if (error != 0) return ErrnoStatus("connect", error);
  return absl::OkStatus();
}

}  // namespace

uint16_t SocketAddress::port() const {
  if (storage.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
}

std::string SocketAddress::ToString() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, text,
              sizeof(text));
    return absl::StrCat("[", text, "]:", port());
  }
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, text,
            sizeof(text));
  return absl::StrCat(text, ":", port());
}

absl::StatusOr<SocketAddress> ParseSocketAddress(absl::string_view address,
                                                 uint16_t port) {
  const std::string text(address);
  SocketAddress out;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out.storage);
  if (inet_pton(AF_INET, text.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    out.length = sizeof(sockaddr_in);
    return out;
  }
  out = SocketAddress{};
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
  if (inet_pton(AF_INET6, text.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    out.length = sizeof(sockaddr_in6);
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", address, "' is not a numeric IPv4 or IPv6 address"));
}

absl::StatusOr<UniqueFd> Listen(const SocketAddress& local) {
  FL_ASSIGN_OR_RETURN(UniqueFd fd, NewTcpSocket(local));
  FL_RETURN_IF_ERROR(
      SetOption(fd.get(), SOL_SOCKET, SO_REUSEADDR, 1, "setsockopt(SO_REUSEADDR)"));
  // Accepted sockets inherit the buffers; setting them before listen() lets the
  // kernel advertise a matching window scale in the handshake.
  FL_RETURN_IF_ERROR(SetBuffers(fd.get()));
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&local.storage), local.length) !=
      0) {
    return ErrnoStatus("bind", errno);
  }
  if (listen(fd.get(), kListenBacklog) != 0) return ErrnoStatus("listen", errno);
  return fd;
}

absl::StatusOr<SocketAddress> LocalAddress(int fd) {
  SocketAddress out;
  out.length = sizeof(out.storage);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&out.storage), &out.length) != 0) {
    return ErrnoStatus("getsockname", errno);
  }
  return out;
}

absl::StatusOr<UniqueFd> BoundDataSocket(const SocketAddress& local,
                                         const SocketAddress& remote) {
  FL_ASSIGN_OR_RETURN(UniqueFd fd, NewTcpSocket(remote));
  FL_RETURN_IF_ERROR(ConfigureDataSocket(fd.get()));
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&local.storage), local.length) !=
      0) {
    return ErrnoStatus("bind", errno);
  }
  return fd;
}

absl::Status ConnectSocket(int fd, const SocketAddress& remote, int timeout_ms,
                           const PendingSockets* pending) {
  FL_RETURN_IF_ERROR(SetBlocking(fd, false));
  if (connect(fd, reinterpret_cast<const sockaddr*>(&remote.storage), remote.length) !=
      0) {
    if (errno != EINPROGRESS) return ErrnoStatus("connect", errno);
    // A CancelAll from here on aborts the connect; one before it found nothing to do.
    if (pending != nullptr) FL_RETURN_IF_ERROR(pending->OrCancelled(absl::OkStatus()));
    FL_RETURN_IF_ERROR(AwaitConnect(fd, timeout_ms));
  }
  return SetBlocking(fd, true);
}

absl::StatusOr<UniqueFd> ConnectFrom(const SocketAddress& local,
                                     const SocketAddress& remote, int timeout_ms) {
  FL_ASSIGN_OR_RETURN(UniqueFd fd, BoundDataSocket(local, remote));
  FL_RETURN_IF_ERROR(ConnectSocket(fd.get(), remote, timeout_ms));
  return fd;
}

PendingSockets::Ticket::~Ticket() {
  if (owner_ == nullptr) return;
  absl::MutexLock lock(&owner_->mu_);
  owner_->fds_.erase(fd_);
}

absl::StatusOr<PendingSockets::Ticket> PendingSockets::Track(int fd) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("fabric shutting down");
  fds_.insert(fd);
  return Ticket(this, fd);
}

void PendingSockets::CancelAll() {
  absl::MutexLock lock(&mu_);  // held: no tracked fd is closed while we shut it down
  cancelled_ = true;
  for (int fd : fds_) shutdown(fd, SHUT_RDWR);
}

absl::Status PendingSockets::OrCancelled(absl::Status failure) const {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("fabric shutting down");
  return failure;
}

absl::StatusOr<UniqueFd> Accept(int listener) {
  UniqueFd fd(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus("accept4", errno);
  return fd;
}

absl::Status ConfigureDataSocket(int fd) {
  FL_RETURN_IF_ERROR(
      SetOption(fd, IPPROTO_TCP, TCP_NODELAY, 1, "setsockopt(TCP_NODELAY)"));
  FL_RETURN_IF_ERROR(SetOption(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, kUnackedTimeoutMs,
                               "setsockopt(TCP_USER_TIMEOUT)"));
  FL_RETURN_IF_ERROR(
      SetOption(fd, SOL_SOCKET, SO_KEEPALIVE, 1, "setsockopt(SO_KEEPALIVE)"));
  FL_RETURN_IF_ERROR(SetOption(fd, IPPROTO_TCP, TCP_KEEPIDLE, kKeepaliveIdleS,
                               "setsockopt(TCP_KEEPIDLE)"));
  FL_RETURN_IF_ERROR(SetOption(fd, IPPROTO_TCP, TCP_KEEPINTVL, kKeepaliveIntervalS,
                               "setsockopt(TCP_KEEPINTVL)"));
  FL_RETURN_IF_ERROR(SetOption(fd, IPPROTO_TCP, TCP_KEEPCNT, kKeepaliveProbes,
                               "setsockopt(TCP_KEEPCNT)"));
  return SetBuffers(fd);
}

absl::Status SetReceiveTimeout(int fd, int timeout_ms) {
  timeval timeout{.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)) != 0) {
    return ErrnoStatus("setsockopt(SO_RCVTIMEO)", errno);
  }
  return absl::OkStatus();
}

absl::Status SetSendTimeout(int fd, int timeout_ms) {
  timeval timeout{.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
  if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout)) != 0) {
    return ErrnoStatus("setsockopt(SO_SNDTIMEO)", errno);
  }
  return absl::OkStatus();
}

absl::Status SendAll(int fd, std::span<iovec> iov) {
  while (!iov.empty()) {
    msghdr message{};
    message.msg_iov = iov.data();
    message.msg_iovlen = iov.size();
    ssize_t sent = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      // With a send timeout, a call that took no byte at all ends so.
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError(
            "the peer took no byte within the send timeout");
      }
      return ErrnoStatus("sendmsg", errno);
    }
    auto left = static_cast<size_t>(sent);
    while (!iov.empty() && left >= iov.front().iov_len) {
      left -= iov.front().iov_len;
      iov = iov.subspan(1);
    }
    if (!iov.empty()) {
      iov.front().iov_base = static_cast<char*>(iov.front().iov_base) + left;
      iov.front().iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* data, size_t bytes) {
  // A socket with no receive timeout never wakes quiet; one that has one ends the
  // receive as recv(2) says, as a plain receive always did.
  return RecvAllOr(fd, data, bytes, [](size_t) { return ErrnoStatus("recv", EAGAIN); });
}

absl::Status RecvAllOr(int fd, void* data, size_t bytes,
                       absl::FunctionRef<absl::Status(size_t received)> quiet) {
  auto* at = static_cast<char*>(data);
  size_t received = 0;
  while (received < bytes) {
    // MSG_WAITALL with a timeout returns what came by then: progress, not quiet.
    ssize_t got = recv(fd, at + received, bytes - received, MSG_WAITALL);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        FL_RETURN_IF_ERROR(quiet(received));
        continue;
      }
      return ErrnoStatus("recv", errno);
    }
    if (got == 0) return absl::UnavailableError("peer closed the connection");
    received += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status RecvAllBefore(int fd, void* data, size_t bytes, absl::Time deadline) {
  auto* at = static_cast<char*>(data);
  while (bytes > 0) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      return absl::DeadlineExceededError("the peer did not send its frame in time");
    }
    FL_RETURN_IF_ERROR(
        SetReceiveTimeout(fd, static_cast<int>(std::min<int64_t>(left_ms, INT32_MAX))));
    ssize_t got = recv(fd, at, bytes, MSG_WAITALL);
    if (got < 0) {
      // EAGAIN: the timeout ran out; the loop checks the deadline.
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return ErrnoStatus("recv", errno);
    }
    if (got == 0) return absl::UnavailableError("peer closed the connection");
    at += got;
    bytes -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

int TickMs(int timeout_ms, int ticks) { return std::max(1, timeout_ms / ticks); }

absl::Status RecvAllUnlessStalled(int fd, void* data, size_t bytes, int stall_timeout_ms,
                                  bool begun) {
  const absl::Duration stall = absl::Milliseconds(stall_timeout_ms);
  const absl::Duration tick = absl::Milliseconds(TickMs(stall_timeout_ms, kStallTicks));
  absl::Time last_byte = absl::Now();  // the earlier part's, for a begun frame
  size_t seen = 0;
  return RecvAllOr(fd, data, bytes, [&](size_t received) -> absl::Status {
    const absl::Time now = absl::Now();
    // An idle connection between frames: no stall.
    if (received == 0 && !begun) return absl::OkStatus();
    // Bytes since the last quiet tick: they came before this tick's silence began,
    // so no later than one tick ago (counting from then is never early).
    if (received != seen) {
      seen = received;
      last_byte = now - tick;
      return absl::OkStatus();
    }
    if (now - last_byte < stall) return absl::OkStatus();
    return WithReason(absl::DeadlineExceededError(absl::StrCat(
                          "the peer sent no byte of a begun frame for ", stall_timeout_ms,
                          " ms (", received, " of ", bytes, " bytes of this part came)")),
                      reasons::kFabricStall);
  });
}

}  // namespace fuselink::fabric
