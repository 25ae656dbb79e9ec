// Thin wrappers over the BSD socket calls the TCP fabric makes. Each errno failure
// becomes an absl::Status here, once, through ErrnoStatus.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/unique_fd.h"

namespace fuselink::fabric {

// Kernel socket buffer sizes asked for on every fabric socket: large enough to keep
// a fast link busy with one write in flight per connection.
inline constexpr int kSocketBufferBytes = 4 << 20;
// A connection whose sent bytes stay unacknowledged this long is dead (a rail that
// went down): its writes fail and their chunks move to other NICs, rather than
// waiting out TCP's default of minutes. Idle connections are probed as often.
inline constexpr int kUnackedTimeoutMs = 5000;
inline constexpr int kKeepaliveIdleS = 5;
inline constexpr int kKeepaliveIntervalS = 1;
inline constexpr int kKeepaliveProbes = 3;
// Connections a listener lets the kernel complete before we accept them.
inline constexpr int kListenBacklog = 128;

// An IPv4 or IPv6 address and port.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  uint16_t port() const;
  // "1.2.3.4:5" or "[::1]:5".
  std::string ToString() const;
};

// INVALID_ARGUMENT unless `address` is a numeric IPv4 or IPv6 address.
absl::StatusOr<SocketAddress> ParseSocketAddress(absl::string_view address,
                                                 uint16_t port);

// A TCP socket bound to `local` and listening; local.port() == 0 lets the kernel
// pick the port (read it back with LocalAddress).
absl::StatusOr<UniqueFd> Listen(const SocketAddress& local);
absl::StatusOr<SocketAddress> LocalAddress(int fd);

// A TCP connection from `local` (port 0: any) to `remote`, configured for the data
// path; gives up after timeout_ms. The two halves: a socket bound to `local` and
// configured, then its connect.
absl::StatusOr<UniqueFd> ConnectFrom(const SocketAddress& local,
                                     const SocketAddress& remote, int timeout_ms);
class PendingSockets;
absl::StatusOr<UniqueFd> BoundDataSocket(const SocketAddress& local,
                                         const SocketAddress& remote);
// With `pending` (which tracks `fd`): CANCELLED, rather than waiting, when its
// CancelAll ran before the connect began (a shutdown before connect() is a no-op).
absl::Status ConnectSocket(int fd, const SocketAddress& remote, int timeout_ms,
                           const PendingSockets* pending = nullptr);

// The sockets whose connect or handshake is under way, so that a shutdown can end
// them at once rather than wait out their timeouts: shutdown(2) aborts a connect
// whose SYN is still unanswered and wakes a read blocked in a handshake. Once
// cancelled, it refuses to track more (CANCELLED), so no new connect starts.
class PendingSockets {
 public:
  // Keeps `fd` tracked while it lives; must be destroyed before `fd` is closed.
  class Ticket {
   public:
    Ticket(Ticket&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)), fd_(other.fd_) {}
    Ticket& operator=(Ticket&&) = delete;
    ~Ticket();

   private:
    friend class PendingSockets;
    Ticket(PendingSockets* owner, int fd) : owner_(owner), fd_(fd) {}
    PendingSockets* owner_;
    int fd_;
  };

  absl::StatusOr<Ticket> Track(int fd);
  // Shuts every tracked socket down; later Tracks fail.
  void CancelAll();
  // `failure`, or CANCELLED when CancelAll has run (also for an OK `failure`: a
  // connect that finished just as it ran is not used).
  absl::Status OrCancelled(absl::Status failure) const;

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<int> fds_ ABSL_GUARDED_BY(mu_);
};
// Accepts one connection on a listener; UNAVAILABLE when none is pending.
absl::StatusOr<UniqueFd> Accept(int listener);

// TCP_NODELAY and kSocketBufferBytes buffers.
absl::Status ConfigureDataSocket(int fd);
// Bounds how long a blocking receive waits; 0 waits forever.
absl::Status SetReceiveTimeout(int fd, int timeout_ms);
// Bounds how long a blocking send waits for the peer to take a byte; 0 waits forever.
absl::Status SetSendTimeout(int fd, int timeout_ms);

// Sends all of `iov` (modified in place as it goes) with MSG_NOSIGNAL.
// DEADLINE_EXCEEDED when the socket has a send timeout (SetSendTimeout) and the peer
// took no byte within it.
absl::Status SendAll(int fd, std::span<iovec> iov);
// Receives exactly `bytes`; UNAVAILABLE when the peer closes first.
absl::Status RecvAll(int fd, void* data, size_t bytes);
// The same on a socket with a receive timeout (SetReceiveTimeout): each time one
// receive ends with no byte, `quiet(received)`, given the bytes this call has
// received so far, decides: OK waits on, an error ends the receive with it. So the
// caller ticks at the timeout and judges progress itself; a shutdown(2) from another
// thread still ends the wait at once (UNAVAILABLE).
absl::Status RecvAllOr(int fd, void* data, size_t bytes,
                       absl::FunctionRef<absl::Status(size_t received)> quiet);
// The same, all of it before `deadline` (DEADLINE_EXCEEDED otherwise), however the
// peer spreads the bytes out. Leaves a receive timeout set on the socket.
absl::Status RecvAllBefore(int fd, void* data, size_t bytes, absl::Time deadline);

// The stall bound of a fabric connection once a frame has begun (the TCP fabric's
// connections, the verbs fabric's control connections): how many times per bound a
// waiting receive wakes to judge it, so that the close comes at most bound / ticks
// late.
inline constexpr int kStallTicks = 4;
// A wait of `timeout_ms` judged in `ticks` wakes: the receive timeout to set, at
// least 1 ms.
int TickMs(int timeout_ms, int ticks);
// Receives `bytes` of a frame on a socket whose receive timeout is
// TickMs(stall_timeout_ms, kStallTicks). Before its first byte, a frame not yet
// `begun` may wait as long as the peer likes (a connection idle between frames); once
// begun (a byte of it came, or `begun`: an earlier part of the same frame did, just
// before this call), DEADLINE_EXCEEDED with reason FABRIC_STALL when no byte came for
// stall_timeout_ms: between 1x and 1.25x that after the last byte. UNAVAILABLE when
// the peer closes or another thread shuts the socket down.
absl::Status RecvAllUnlessStalled(int fd, void* data, size_t bytes, int stall_timeout_ms,
                                  bool begun);

}  // namespace fuselink::fabric
