// Raw SCM_RIGHTS sends for tests of the handle socket: any bytes, any number of
// descriptors, as a well-behaved client (services::SendFd) never sends them.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace fuselink::testing {

// One sendmsg of `data` with `fds` attached on `socket_fd`; its result.
ssize_t SendWithFds(int socket_fd, const std::string& data, const std::vector<int>& fds);

}  // namespace fuselink::testing
