#include "agent/nicstat/netdev.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

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
    out.push_back(InterfaceAddress{.name = a->ifa_name,
                                   .ipv4 = text,
                                   .loopback = (a->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(list);
  return out;
}

absl::StatusOr<InterfaceAddress> NetdevOf(
    absl::string_view ipv4, const std::vector<InterfaceAddress>& interfaces) {
  for (const InterfaceAddress& a : interfaces) {
    if (a.ipv4 == ipv4) return a;
  }
  return WithReason(absl::NotFoundError(absl::StrCat(
                        "no interface in this network namespace holds ", ipv4)),
                    "NO_NETDEV");
}

}  // namespace fuselink::nicstat
