#include "services/handle_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::services {
namespace {

// A client gets this long to send each message before it is dropped.
constexpr int kClientTimeoutMs = 2000;
constexpr char kSendFd = 'F';

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

void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
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
    UniqueFd passed;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
          c->cmsg_len == CMSG_LEN(sizeof(int))) {
        int received;
        std::memcpy(&received, CMSG_DATA(c), sizeof(int));
        passed.reset(received);
      }
    }
    absl::StatusOr<uint64_t> token =
        (op != kSendFd || !passed.valid() || (msg.msg_flags & MSG_CTRUNC))
            ? absl::InvalidArgumentError("expected one descriptor with 'F'")
            : tokens_->Put(std::move(passed));
    uint8_t reply[16] = {};
    PutU32(reply, static_cast<uint32_t>(token.status().code()));
    PutU64(reply + 8, token.ok() ? *token : 0);
    if (send(fd, reply, sizeof(reply), MSG_NOSIGNAL) != sizeof(reply)) return;
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
  uint8_t reply[16];
  size_t got = 0;
  while (got < sizeof(reply)) {
    const ssize_t n = recv(fd.get(), reply + got, sizeof(reply) - got, 0);
    if (n <= 0)
      return ErrnoStatus("recv(handle socket reply)", n == 0 ? ECONNRESET : errno);
    got += static_cast<size_t>(n);
  }
  const uint32_t code = reply[0] | reply[1] << 8 | reply[2] << 16 | reply[3] << 24;
  if (code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(code),
                        "the agent refused the descriptor");
  }
  return GetU64(reply + 8);
}

}  // namespace fuselink::services
