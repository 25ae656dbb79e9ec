#include "agent/common/ipv4_interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink {
namespace {

// Calls `visit` for every entry of getifaddrs with an address of `family`.
absl::Status ForEachAddress(int family, absl::FunctionRef<void(const ifaddrs&)> visit) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return WithReason(
        absl::UnavailableError(absl::StrCat("getifaddrs: ", std::strerror(errno))),
        reasons::kGetifaddrs);
  }
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr != nullptr && a->ifa_addr->sa_family == family) visit(*a);
  }
  freeifaddrs(list);
  return absl::OkStatus();
}

int PrefixBits(const uint8_t* mask, size_t bytes) {
  int bits = 0;
  for (size_t i = 0; i < bytes; ++i) bits += __builtin_popcount(mask[i]);
  return bits;
}

}  // namespace

absl::StatusOr<std::vector<InterfaceAddress>> ListInterfaces() {
  std::vector<InterfaceAddress> out;
  FL_RETURN_IF_ERROR(ForEachAddress(AF_INET, [&](const ifaddrs& a) {
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a.ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) == nullptr) return;
    int prefix = 32;
    if (a.ifa_netmask != nullptr) {
      const auto* mask = reinterpret_cast<const sockaddr_in*>(a.ifa_netmask);
      prefix = PrefixBits(reinterpret_cast<const uint8_t*>(&mask->sin_addr), 4);
    }
    out.push_back(InterfaceAddress{.name = a.ifa_name,
                                   .ipv4 = text,
                                   .loopback = (a.ifa_flags & IFF_LOOPBACK) != 0,
                                   .prefix_bits = prefix});
  }));
  return out;
}

absl::StatusOr<std::vector<Ipv6InterfaceAddress>> ListIpv6Interfaces() {
  std::vector<Ipv6InterfaceAddress> out;
  FL_RETURN_IF_ERROR(ForEachAddress(AF_INET6, [&](const ifaddrs& a) {
    char text[INET6_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in6*>(a.ifa_addr);
    if (inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof text) == nullptr) return;
    int prefix = 128;
    if (a.ifa_netmask != nullptr) {
      const auto* mask = reinterpret_cast<const sockaddr_in6*>(a.ifa_netmask);
      prefix = PrefixBits(mask->sin6_addr.s6_addr, 16);
    }
    out.push_back(Ipv6InterfaceAddress{.name = a.ifa_name,
                                       .ipv6 = text,
                                       .loopback = (a.ifa_flags & IFF_LOOPBACK) != 0,
                                       .prefix_bits = prefix,
                                       .scope_id = in->sin6_scope_id});
  }));
  return out;
}

}  // namespace fuselink
