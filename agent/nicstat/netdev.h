// Which network interface holds a NIC's IPv4 address: the netdev whose kernel
// counters see that NIC's traffic. The interface list comes from ListInterfaces, or
// from a test.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/common/ipv4_interfaces.h"

namespace fuselink::nicstat {

using ::fuselink::InterfaceAddress;
using ::fuselink::ListInterfaces;

// The interface that holds `ipv4`; failing that, a loopback interface whose subnet
// holds it (127.0.1.1 is the loopback's, though only 127.0.0.1/8 is assigned).
// NOT_FOUND (NO_NETDEV) when none does.
absl::StatusOr<InterfaceAddress> NetdevOf(
    absl::string_view ipv4, const std::vector<InterfaceAddress>& interfaces);

}  // namespace fuselink::nicstat
