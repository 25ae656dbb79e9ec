// This network namespace's interface addresses, read through getifaddrs: the IPv4 ones
// for the topology's discovery, the foreign-traffic watch and the verbs fabric's IPoIB
// lookup alike; the IPv6 ones for the verbs fabric only (a NIC given by an IPv6
// address).
#pragma once

#include <cstdint>
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

struct Ipv6InterfaceAddress {
  std::string name;  // netdev
  std::string ipv6;  // as inet_ntop writes it (compressed, lower case), no scope
  bool loopback = false;
  int prefix_bits = 128;
  uint32_t scope_id = 0;  // non-zero for link-local addresses: the interface index
};

// Every IPv6 address of every interface, link-local ones included, in getifaddrs
// order; errors as ListInterfaces. A separate call so that the IPv4 users above never
// see an IPv6 address.
absl::StatusOr<std::vector<Ipv6InterfaceAddress>> ListIpv6Interfaces();

}  // namespace fuselink
