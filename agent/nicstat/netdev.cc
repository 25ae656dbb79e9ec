#include "agent/nicstat/netdev.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::nicstat {

absl::StatusOr<std::vector<InterfaceAddress>> ListInterfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::UnavailableError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
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

absl::StatusOr<InterfaceAddress> NetdevOf(
    absl::string_view ipv4, const std::vector<InterfaceAddress>& interfaces) {
  for (const InterfaceAddress& a : interfaces) {
    if (a.ipv4 == ipv4) return a;
  }
  in_addr want{}, have{};
  if (inet_pton(AF_INET, std::string(ipv4).c_str(), &want) == 1) {
    for (const InterfaceAddress& a : interfaces) {
      if (!a.loopback || a.prefix_bits < 0 || a.prefix_bits > 32 ||
          inet_pton(AF_INET, a.ipv4.c_str(), &have) != 1) {
        continue;
      }
      const uint32_t mask = a.prefix_bits == 0 ? 0 : ~uint32_t{0} << (32 - a.prefix_bits);
      if ((ntohl(want.s_addr) & mask) == (ntohl(have.s_addr) & mask)) return a;
    }
  }
  return WithReason(absl::NotFoundError(absl::StrCat(
                        "no interface in this network namespace holds ", ipv4)),
                    "NO_NETDEV");
}

}  // namespace fuselink::nicstat
