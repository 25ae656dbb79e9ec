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
};

// This network namespace's IPv4 interface addresses (getifaddrs). UNAVAILABLE with
// errno's text if the call fails.
absl::StatusOr<std::vector<InterfaceAddress>> ListInterfaces();

// The interface that holds `ipv4`. NOT_FOUND (NO_NETDEV) when none does.
absl::StatusOr<InterfaceAddress> NetdevOf(
    absl::string_view ipv4, const std::vector<InterfaceAddress>& interfaces);

}  // namespace fuselink::nicstat
