#include "agent/common/ipv4_interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink {

absl::StatusOr<std::vector<InterfaceAddress>> ListInterfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return WithReason(
        absl::UnavailableError(absl::StrCat("getifaddrs: ", std::strerror(errno))),
        "GETIFADDRS");
  }
  std::vector<InterfaceAddress> out;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) == nullptr) continue;
    int prefix = 32;
    if (a->ifa_netmask != nullptr) {
      const auto* mask = reinterpret_cast<const sockaddr_in*>(a->ifa_netmask);
      prefix = __builtin_popcount(mask->sin_addr.s_addr);
    }
    out.push_back(InterfaceAddress{.name = a->ifa_name,
                                   .ipv4 = text,
                                   .loopback = (a->ifa_flags & IFF_LOOPBACK) != 0,
                                   .prefix_bits = prefix});
  }
  freeifaddrs(list);
  return out;
}

}  // namespace fuselink
