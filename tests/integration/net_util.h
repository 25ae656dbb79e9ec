// Plain sockets for the tests that talk to an agent the way no client library would:
// a raw TCP connection to a NIC port.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/common/unique_fd.h"

namespace fuselink::testing {

// A TCP connection to `host`:`port`.
absl::StatusOr<UniqueFd> TcpConnect(const std::string& host, uint16_t port);

// True when the peer closes `fd` (EOF or reset) within `timeout`; bytes it sends
// first are read and dropped.
bool WaitUntilClosed(int fd, absl::Duration timeout);

// A port on 127.0.0.1 that nothing listens on while the returned socket stays open:
// it is bound, never listened on, so connecting is refused.
absl::StatusOr<UniqueFd> ReserveClosedPort(uint16_t* port);

}  // namespace fuselink::testing
