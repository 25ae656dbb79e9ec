// The agent's Unix socket for file descriptors: an engine sends a memfd (or a VMM
// export) with SCM_RIGHTS and gets back a token that RegisterTensor then names.
// gRPC cannot carry descriptors; this socket carries nothing else.
//
// Protocol, per message (handle_protocol.h has it as bytes): the client sends 1 byte
// ('F') with one descriptor attached; the agent answers 16 bytes: u32 code
// (absl::StatusCode, 0 = OK), u32 reserved, u64 token (little-endian). Connections
// may send many messages.
//
// Safe on a node shared with other users and other engines:
// - The socket file is 0600 in a directory of the agent's uid with no group or other
//   access (PrepareRuntimeDir), so only the agent's uid (and root) can connect.
// - Every connection's kernel credentials (SO_PEERCRED: pid, uid, gid) go with the
//   descriptors it passes, into the token and on to the tensor (memory::Lender).
// - One thread serves up to kMaxHandleClients connections at once with poll(2) over
//   non-blocking sockets, so that a slow or silent client delays no other. A message
//   is one byte and so arrives whole; the limits are on time between messages and on
//   taking replies: a client that sends nothing for kHandleIdleTimeout (after
//   connecting or after its last reply went out), or leaves a reply untaken for
//   kHandleReplyTimeout, is closed. Engines connect once per descriptor (both
//   clients in this tree do), so an idle connection only holds a slot. A connection
//   refused kMaxHandleRefusals times is closed after the last refusal's reply.
// - Past kMaxHandleClients, a new connection is answered RESOURCE_EXHAUSTED (best
//   effort: the client may see only the close) and closed.
// - Descriptors arrive with MSG_CMSG_CLOEXEC; each one not kept (more than one on a
//   message, or any on a message that is not 'F') is closed at once.
// Each refusal is counted (handle_socket_stats.h).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/common/unique_fd.h"
#include "agent/memory/fd_tokens.h"
#include "agent/memory/lender.h"
#include "services/handle_socket/protocol.h"
#include "services/handle_socket/stats.h"

namespace fuselink::services {

// Connections served at once; one more is refused. Each costs a pollfd of a fixed
// array and a few dozen bytes.
inline constexpr size_t kMaxHandleClients = 64;
static_assert(kMaxHandleClients >= 1 && kMaxHandleClients <= 1024,
              "one poll(2) array of kMaxHandleClients + 2 entries, on the stack");
// Connections the kernel queues before accept.
inline constexpr int kHandleListenBacklog = 64;
// Connections accepted (or refused) per turn of the loop, so that a flood of
// connects cannot starve the clients already served.
inline constexpr size_t kMaxAcceptsPerTurn = 16;
// A client sends its next message within this, after connecting or after its last
// reply went out.
inline constexpr absl::Duration kHandleIdleTimeout = absl::Seconds(2);
// A client takes each reply (reads it from its socket buffer) within this.
inline constexpr absl::Duration kHandleReplyTimeout = absl::Seconds(2);
// Refusals (bad messages, or tokens the agent could not issue) one connection may
// have; the last reply goes out, then the connection is closed.
inline constexpr int kMaxHandleRefusals = 8;
// Descriptors one recvmsg makes room for: enough to see, and close, a message that
// carries several; the kernel itself closes those past it (MSG_CTRUNC).
inline constexpr size_t kMaxHandleFdsSeen = 4;
static_assert(kMaxHandleFdsSeen >= 2, "must see a second descriptor to refuse it");

// The directory the default socket lives in.
inline constexpr absl::string_view kDefaultRuntimeDir = "/run/fuselink";

// Makes `dir` the agent's private directory: created with mode 0700 if absent (its
// parent must exist); if present, it must be a directory (not a link to one) owned by
// this process's effective uid, with no access for group or others.
// FAILED_PRECONDITION (reason RUNTIME_DIR_UNSAFE) otherwise; the directory is never
// changed, since it may be someone else's. mkdir/lstat errors as their errno says.
absl::Status PrepareRuntimeDir(const std::string& dir);

// `<runtime_dir>/<node>.sock`. INVALID_ARGUMENT when the node's name is not one
// path component ('/' in it, or "." or ".."): then give --handle_socket.
absl::StatusOr<std::string> DefaultSocketPath(absl::string_view runtime_dir,
                                              absl::string_view node);

class HandleSocket {
 public:
  // Listens at `path`: its parent directory passes PrepareRuntimeDir (and is created
  // if absent), a socket file already there is replaced (anything else there is
  // FAILED_PRECONDITION), and the socket file is made 0600. Tokens go to `tokens`,
  // counts to `counters` (null: the socket keeps its own); both outlive the socket.
  static absl::StatusOr<std::unique_ptr<HandleSocket>> Listen(
      std::string path, memory::FdTokens* tokens,
      HandleSocketCounters* counters = nullptr);
  // Closes every connection and removes the socket file.
  ~HandleSocket();
  const std::string& path() const { return path_; }
  HandleSocketStats stats() const { return counters_->Read(); }

 private:
  // One connection; owned and touched by the serving thread only.
  struct Client {
    UniqueFd fd;
    memory::Lender peer;  // SO_PEERCRED, read once at accept
    // Silent, or not taking its reply, past this: closed.
    absl::Time deadline;
    handle_protocol::Reply reply{};
    size_t reply_sent_bytes = handle_protocol::kReplyBytes;  // == kReplyBytes: none
    int refusals = 0;
    bool close_after_reply = false;
    bool done = false;  // to be closed at the end of this turn
    bool replying() const { return reply_sent_bytes < reply.size(); }
  };

  HandleSocket(std::string path, UniqueFd listen_fd, UniqueFd wake_fd,
               memory::FdTokens* tokens, HandleSocketCounters* counters);
  void Serve();
  void AcceptSome(absl::Time now);
  void Read(Client& client, absl::Time now);
  void Flush(Client& client, absl::Time now);

  const std::string path_;
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd: readable once the destructor asks Serve to return
  memory::FdTokens* const tokens_;
  HandleSocketCounters own_counters_;
  HandleSocketCounters* const counters_;
  // Serving thread only; at most kMaxHandleClients, reserved at construction.
  std::vector<Client> clients_;
  absl::Time accept_paused_until_ = absl::InfinitePast();  // after EMFILE and kin
  std::thread thread_;
};

// Client side: sends `fd` to the agent at `path`, returns the token.
absl::StatusOr<uint64_t> SendFd(const std::string& path, int fd);

}  // namespace fuselink::services
