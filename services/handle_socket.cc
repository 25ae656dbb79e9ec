#include "services/handle_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "services/handle_protocol.h"

namespace fuselink::services {
namespace {

// A client gets this long to send each message before it is dropped.
constexpr int kClientTimeoutMs = 2000;
using handle_protocol::kSendFd;

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

}  // namespace

absl::StatusOr<std::unique_ptr<HandleSocket>> HandleSocket::Listen(
    std::string path, memory::FdTokens* tokens) {
  FL_ASSIGN_OR_RETURN(sockaddr_un addr, Address(path));
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket(AF_UNIX)", errno);
  unlink(path.c_str());
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(absl::StrCat("bind(", path, ")"), errno);
  }
  if (listen(fd.get(), 64) != 0) return ErrnoStatus("listen(handle socket)", errno);
  return std::unique_ptr<HandleSocket>(
      new HandleSocket(std::move(path), std::move(fd), tokens));
}

HandleSocket::HandleSocket(std::string path, UniqueFd fd, memory::FdTokens* tokens)
    : path_(std::move(path)), listen_fd_(std::move(fd)), tokens_(tokens) {
  thread_ = std::thread([this] { Serve(); });
}

HandleSocket::~HandleSocket() {
  stop_.store(true);
  shutdown(listen_fd_.get(), SHUT_RDWR);
  thread_.join();
  unlink(path_.c_str());
}

void HandleSocket::Serve() {
  while (!stop_.load()) {
    pollfd p{listen_fd_.get(), POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    UniqueFd client(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!client.valid()) continue;
    ServeClient(client.get());
  }
}

void HandleSocket::ServeClient(int fd) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, kClientTimeoutMs) <= 0) return;
    char op = 0;
    iovec iov{&op, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) return;
    // Every descriptor that arrived is owned here, so that those not kept close.
    std::vector<UniqueFd> passed;
    for (int received : handle_protocol::PassedDescriptors(control, msg.msg_controllen)) {
      passed.emplace_back(received);
    }
    std::vector<int> received;
    for (const UniqueFd& p : passed) received.push_back(p.get());
    absl::StatusOr<int> requested = handle_protocol::RequestedDescriptor(
        absl::string_view(&op, static_cast<size_t>(n)), received, msg.msg_flags);
    const absl::StatusOr<uint64_t> token =
        requested.ok() ? tokens_->Put(std::move(passed[0]))
                       : absl::StatusOr<uint64_t>(requested.status());
    const handle_protocol::Reply reply = handle_protocol::EncodeReply(token);
    if (send(fd, reply.data(), reply.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(reply.size())) {
      return;
    }
  }
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
