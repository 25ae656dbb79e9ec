// The interface listings on this machine's own namespace: the IPv4 list never holds an
// IPv6 address, and the IPv6 list reads loopback's ::1 where IPv6 is enabled.
#include <arpa/inet.h>

#include <string>
#include <vector>

#include "agent/common/ipv4_interfaces.h"
#include "gtest/gtest.h"

namespace fuselink {
namespace {

TEST(Interfaces, TheIpv4ListHoldsOnlyIpv4) {
  absl::StatusOr<std::vector<InterfaceAddress>> list = ListInterfaces();
  ASSERT_TRUE(list.ok()) << list.status();
  for (const InterfaceAddress& a : *list) {
    in_addr parsed{};
    EXPECT_EQ(inet_pton(AF_INET, a.ipv4.c_str(), &parsed), 1) << a.name << " " << a.ipv4;
  }
}

TEST(Interfaces, TheIpv6ListReadsLoopback) {
  absl::StatusOr<std::vector<Ipv6InterfaceAddress>> list = ListIpv6Interfaces();
  ASSERT_TRUE(list.ok()) << list.status();
  const Ipv6InterfaceAddress* loopback = nullptr;
  for (const Ipv6InterfaceAddress& a : *list) {
    in6_addr parsed{};
    EXPECT_EQ(inet_pton(AF_INET6, a.ipv6.c_str(), &parsed), 1) << a.name << " " << a.ipv6;
    EXPECT_EQ(a.scope_id != 0, IN6_IS_ADDR_LINKLOCAL(&parsed)) << a.name << " " << a.ipv6;
    if (a.ipv6 == "::1") loopback = &a;
  }
  if (loopback == nullptr) GTEST_SKIP() << "no ::1 here (IPv6 disabled on lo?)";
  EXPECT_TRUE(loopback->loopback);
  EXPECT_EQ(loopback->prefix_bits, 128);
  EXPECT_EQ(loopback->scope_id, 0u);
}

}  // namespace
}  // namespace fuselink
