// Which network interface holds a NIC's IPv4 address: the netdev whose kernel
// counters see that NIC's traffic. The interface list comes from getifaddrs, or from
// a test.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fuselink::nicstat {

struct InterfaceAddress {
  std::string name;  // netdev, e.g. "eth0"
  std::string ipv4;  // dotted quad
  bool loopback = false;
  int prefix_bits = 32;  // the address's subnet
};

// This network namespace's IPv4 interface addresses (getifaddrs). UNAVAILABLE with
// errno's text if the call fails.
absl::StatusOr<std::vector<InterfaceAddress>> ListInterfaces();

// The interface that holds `ipv4`; failing that, a loopback interface whose subnet
// holds it (127.0.1.1 is the loopback's, though only 127.0.0.1/8 is assigned).
// NOT_FOUND (NO_NETDEV) when none does.
absl::StatusOr<InterfaceAddress> NetdevOf(
    absl::string_view ipv4, const std::vector<InterfaceAddress>& interfaces);

}  // namespace fuselink::nicstat
