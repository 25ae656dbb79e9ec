// This network namespace's IPv4 interface addresses, read once through getifaddrs:
// for the topology's discovery, the foreign-traffic watch and the verbs fabric's
// IPoIB lookup alike.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fuselink {

struct InterfaceAddress {
  std::string name;  // netdev, e.g. "eth0"
  std::string ipv4;  // dotted quad
  bool loopback = false;
  int prefix_bits = 32;  // the address's subnet
};

// Every IPv4 address of every interface, in getifaddrs order. UNAVAILABLE (reason
// GETIFADDRS) with errno's text if the call fails.
absl::StatusOr<std::vector<InterfaceAddress>> ListInterfaces();

}  // namespace fuselink
