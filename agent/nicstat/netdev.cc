#include "agent/nicstat/netdev.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::nicstat {

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
                    reasons::kNoNetdev);
}

}  // namespace fuselink::nicstat
