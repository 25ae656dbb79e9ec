// Plain sockets for the tests that talk to an agent the way no client library would:
// an HTTP scrape of /metrics, and a raw TCP connection to a NIC port.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/common/unique_fd.h"

namespace fuselink::testing {

// The body of an HTTP/1.0 GET of `url` ("http://host:port/path").
absl::StatusOr<std::string> HttpGet(const std::string& url);

// The sum of the samples of metric `name` in a Prometheus text exposition whose
// label set contains `label` (e.g. `nic="rail0"`; empty: every sample). NOT_FOUND if
// there is none.
absl::StatusOr<double> MetricValue(absl::string_view exposition, absl::string_view name,
                                   absl::string_view label = "");

// A TCP connection to `host`:`port`.
absl::StatusOr<UniqueFd> TcpConnect(const std::string& host, uint16_t port);

// True when the peer closes `fd` (EOF or reset) within `timeout`; bytes it sends
// first are read and dropped.
bool WaitUntilClosed(int fd, absl::Duration timeout);

// A port on 127.0.0.1 that nothing listens on while the returned socket stays open:
// it is bound, never listened on, so connecting is refused.
absl::StatusOr<UniqueFd> ReserveClosedPort(uint16_t* port);

}  // namespace fuselink::testing
