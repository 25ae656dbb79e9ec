#include "tests/common/fd_passing.h"

#include <sys/socket.h>

#include <cstdint>
#include <cstring>

namespace fuselink::testing {

ssize_t SendWithFds(int socket_fd, const std::string& data, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(data.data()), data.size()};
  std::vector<uint8_t> control(CMSG_SPACE(fds.size() * sizeof(int)));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  return sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
}

}  // namespace fuselink::testing
