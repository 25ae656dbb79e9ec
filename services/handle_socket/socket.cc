#include "services/handle_socket/socket.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"

namespace fuselink::services {
namespace {

using handle_protocol::kSendFd;

// After accept fails for want of descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM), the
// pending connection stays queued and the listening socket stays readable: polling
// it again at once would spin.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);
// The poll array: the wake eventfd, the listening socket, then one per client.
constexpr size_t kWakeSlot = 0, kListenSlot = 1, kFirstClientSlot = 2;

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("handle socket path '", path, "' is empty or too long"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

absl::Status Unsafe(std::string message) {
  return WithReason(absl::FailedPreconditionError(std::move(message)),
                    reasons::kRuntimeDirUnsafe);
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// poll(2)'s timeout to `deadline`, rounded up so that a wake-up never comes early.
int PollTimeoutMs(absl::Time now, absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const double ms = std::ceil(absl::ToDoubleMilliseconds(deadline - now));
  return static_cast<int>(std::clamp(ms, 0.0, 60'000.0));
}

}  // namespace

absl::Status PrepareRuntimeDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoStatus(absl::StrCat("mkdir(", dir, ")"), errno);
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) {
    return ErrnoStatus(absl::StrCat("lstat(", dir, ")"), errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return Unsafe(absl::StrCat("runtime directory ", dir,
                               " is not a directory (a symbolic link is refused too)"));
  }
  if (st.st_uid != geteuid()) {
    return Unsafe(absl::StrCat("runtime directory ", dir, " is owned by uid ", st.st_uid,
                               ", not by this agent's uid ", geteuid()));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return Unsafe(absl::StrFormat(
        "runtime directory %s has mode %04o: it must give group and others no access "
        "(chmod 0700 it, or name another with --runtime_dir)",
        dir, st.st_mode & 07777));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> DefaultSocketPath(absl::string_view runtime_dir,
                                              absl::string_view node) {
  if (node.empty() || node == "." || node == ".." ||
      node.find('/') != absl::string_view::npos) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(
            "node name '", BoundedForMessage(node),
            "' is not one path component: give the socket's path with --handle_socket")),
        reasons::kBadSocketPath);
  }
  return absl::StrCat(runtime_dir, "/", node, ".sock");
}

absl::StatusOr<std::unique_ptr<HandleSocket>> HandleSocket::Listen(
    std::string path, memory::FdTokens* tokens, HandleSocketCounters* counters) {
  FL_ASSIGN_OR_RETURN(sockaddr_un addr, Address(path));
  FL_RETURN_IF_ERROR(PrepareRuntimeDir(ParentOf(path)));
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return WithReason(absl::FailedPreconditionError(absl::StrCat(
                            "handle socket path ", path, " exists and is not a socket")),
                        reasons::kRuntimeDirUnsafe);
    }
    if (unlink(path.c_str()) != 0) {
      return ErrnoStatus(absl::StrCat("unlink(", path, ")"), errno);
    }
  }
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus("socket(AF_UNIX)", errno);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(absl::StrCat("bind(", path, ")"), errno);
  }
  // Before listen: until then a connect is refused, so no one reaches the socket
  // while its mode is still bind's (and the directory is private besides).
  if (chmod(path.c_str(), 0600) != 0) {
    return ErrnoStatus(absl::StrCat("chmod(", path, ", 0600)"), errno);
  }
  if (listen(fd.get(), kHandleListenBacklog) != 0) {
    return ErrnoStatus("listen(handle socket)", errno);
  }
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return ErrnoStatus("eventfd(handle socket)", errno);
  return std::unique_ptr<HandleSocket>(new HandleSocket(
      std::move(path), std::move(fd), std::move(wake), tokens, counters));
}

HandleSocket::HandleSocket(std::string path, UniqueFd listen_fd, UniqueFd wake_fd,
                           memory::FdTokens* tokens, HandleSocketCounters* counters)
    : path_(std::move(path)),
      listen_fd_(std::move(listen_fd)),
      wake_fd_(std::move(wake_fd)),
      tokens_(tokens),
      counters_(counters != nullptr ? counters : &own_counters_) {
  clients_.reserve(kMaxHandleClients);
  thread_ = std::thread([this] { Serve(); });
}

HandleSocket::~HandleSocket() {
  const uint64_t one = 1;
  // An eventfd write of 1 fails only when the counter would overflow.
  [[maybe_unused]] const ssize_t written = write(wake_fd_.get(), &one, sizeof(one));
  thread_.join();
  unlink(path_.c_str());
}

void HandleSocket::Serve() {
  NameThisThread("fl-handle-sock");
  SetThreadRole(ThreadRole::kPollLoop);
  std::array<pollfd, kFirstClientSlot + kMaxHandleClients> polled{};
  for (;;) {
    absl::Time now = absl::Now();
    const bool accepting = now >= accept_paused_until_;
    absl::Time next = accepting ? absl::InfiniteFuture() : accept_paused_until_;
    polled[kWakeSlot] = {wake_fd_.get(), POLLIN, 0};
    polled[kListenSlot] = {listen_fd_.get(), static_cast<short>(accepting ? POLLIN : 0),
                           0};
    for (size_t i = 0; i < clients_.size(); ++i) {
      const Client& c = clients_[i];
      polled[kFirstClientSlot + i] = {
          c.fd.get(), static_cast<short>(c.replying() ? POLLOUT : POLLIN), 0};
      next = std::min(next, c.deadline);
    }
    const int ready =
        poll(polled.data(), kFirstClientSlot + clients_.size(), PollTimeoutMs(now, next));
    if (ready < 0 && errno != EINTR) {
      absl::SleepFor(absl::Milliseconds(10));  // ENOMEM: nothing to do but wait
      continue;
    }
    if (ready > 0 && polled[kWakeSlot].revents != 0) return;
    now = absl::Now();
    for (size_t i = 0; i < clients_.size(); ++i) {
      Client& c = clients_[i];
      const short revents = ready > 0 ? polled[kFirstClientSlot + i].revents : 0;
      if (revents != 0) {
        // POLLHUP and POLLERR too: the call that follows sees the end and says so.
        if (c.replying()) {
          Flush(c, now);
        } else {
          Read(c, now);
        }
      } else if (now >= c.deadline) {
        HandleSocketCounters::Add(counters_->timed_out);
        c.done = true;
      }
    }
    std::erase_if(clients_, [](const Client& c) { return c.done; });
    if (ready > 0 && (polled[kListenSlot].revents & POLLIN) != 0) AcceptSome(now);
  }
}

void HandleSocket::AcceptSome(absl::Time now) {
  for (size_t i = 0; i < kMaxAcceptsPerTurn; ++i) {
    UniqueFd fd(
        accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      // EAGAIN: none left. ECONNABORTED and kin: that one is gone, the next waits.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_paused_until_ = now + kAcceptPause;
      }
      return;
    }
    if (clients_.size() >= kMaxHandleClients) {
      HandleSocketCounters::Add(counters_->refused_too_many_clients);
      const handle_protocol::Reply refusal = handle_protocol::EncodeReply(
          absl::ResourceExhaustedError("too many handle socket clients"));
      // Best effort: into an empty socket buffer it fits, but the client may go first.
      [[maybe_unused]] const ssize_t sent =
          send(fd.get(), refusal.data(), refusal.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      continue;  // closed here
    }
    ucred cred{};
    socklen_t cred_bytes = sizeof(cred);
    if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_bytes) != 0 ||
        cred_bytes != sizeof(cred)) {
      // The kernel answers this for every connected AF_UNIX socket; a socket it does
      // not answer for cannot be attributed, so it is not served.
      HandleSocketCounters::Add(counters_->bad_messages);
      continue;
    }
    HandleSocketCounters::Add(counters_->connections);
    Client& c = clients_.emplace_back();
    c.fd = std::move(fd);
    c.peer = memory::Lender{true, cred.pid, cred.uid, cred.gid};
    c.deadline = now + kHandleIdleTimeout;
  }
}

void HandleSocket::Read(Client& client, absl::Time now) {
  char op = 0;
  iovec iov{&op, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxHandleFdsSeen * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(client.fd.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {  // closed by the client (the usual end), or broken
    client.done = true;
    return;
  }
  // Every descriptor that arrived is owned here, so that those not kept close.
  std::vector<UniqueFd> passed;
  std::vector<int> received;
  for (int fd : handle_protocol::PassedDescriptors(control, msg.msg_controllen)) {
    passed.emplace_back(fd);
    received.push_back(fd);
  }
  const absl::StatusOr<int> requested = handle_protocol::RequestedDescriptor(
      absl::string_view(&op, static_cast<size_t>(n)), received, msg.msg_flags);
  if (!requested.ok()) HandleSocketCounters::Add(counters_->bad_messages);
  const absl::StatusOr<uint64_t> token =
      requested.ok() ? tokens_->Put(std::move(passed[0]), client.peer)
                     : absl::StatusOr<uint64_t>(requested.status());
  passed.clear();  // the refused ones close now, before the reply goes
  if (token.ok()) {
    HandleSocketCounters::Add(counters_->descriptors_taken);
  } else {
    ++client.refusals;
  }
  client.reply = handle_protocol::EncodeReply(token);
  client.reply_sent_bytes = 0;
  client.close_after_reply = client.refusals >= kMaxHandleRefusals;
  client.deadline = now + kHandleReplyTimeout;
  Flush(client, now);
}

void HandleSocket::Flush(Client& client, absl::Time now) {
  const ssize_t n =
      send(client.fd.get(), client.reply.data() + client.reply_sent_bytes,
           client.reply.size() - client.reply_sent_bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    client.done = true;
    return;
  }
  client.reply_sent_bytes += static_cast<size_t>(n);
  if (client.replying()) return;
  if (client.close_after_reply) {
    client.done = true;
    return;
  }
  client.deadline = now + kHandleIdleTimeout;
}

absl::StatusOr<uint64_t> SendFd(const std::string& path, int fd_to_send) {
  FL_ASSIGN_OR_RETURN(sockaddr_un addr, Address(path));
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket(AF_UNIX)", errno);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(absl::StrCat("connect(", path, ")"), errno);
  }
  char op = kSendFd;
  iovec iov{&op, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd_to_send, sizeof(int));
  if (sendmsg(fd.get(), &msg, MSG_NOSIGNAL) != 1)
    return ErrnoStatus("sendmsg(fd)", errno);
  handle_protocol::Reply reply;
  size_t got = 0;
  while (got < reply.size()) {
    const ssize_t n = recv(fd.get(), reply.data() + got, reply.size() - got, 0);
    if (n <= 0)
      return ErrnoStatus("recv(handle socket reply)", n == 0 ? ECONNRESET : errno);
    got += static_cast<size_t>(n);
  }
  return handle_protocol::DecodeReply(reply);
}

}  // namespace fuselink::services
