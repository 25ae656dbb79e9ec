// The verbs fabric over RoCE v2 with IPv6 GIDs: two fabrics in one process, "a" on the
// A ends of the rails and "b" on the B ends, each NIC named by a global IPv6 address.
// FUSELINK_RDMA_RAILS6="a0,b0;a1,b1" names each rail's two addresses, on the same
// interfaces as FUSELINK_RDMA_RAILS's IPv4 pairs (FUSELINK_RDMA_VETHS);
// scripts/rdma-vm.sh sets all three inside its Soft-RoCE VM. Skips, saying why, elsewhere
// (main() in verbs_fabric_test.cc turns an all-skipped run into exit 77).
#include <arpa/inet.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/common/ipv4_interfaces.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/verbs/device.h"
#include "agent/fabric/verbs/fabric.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"
#include "tests/rdma/rails.h"

namespace fuselink::fabric {
namespace {

constexpr uint8_t kUntouched = 0xAB;

using testing::Rail;

std::vector<Rail> Rails6() { return testing::RailsFrom("FUSELINK_RDMA_RAILS6"); }

// The 16 bytes of an IPv6 address as text in any spelling (sysfs writes every group
// in full), or all zero.
ibv_gid Parse6(const std::string& text) {
  ibv_gid gid{};
  if (inet_pton(AF_INET6, text.c_str(), gid.raw) != 1) return ibv_gid{};
  return gid;
}

bool SameGid(const ibv_gid& x, const ibv_gid& y) {
  return std::memcmp(x.raw, y.raw, sizeof(x.raw)) == 0;
}

// An interface's counter from /proc/net/dev_snmp6 (IPv6 only), or -1.
int64_t Ipv6Counter(const std::string& netdev, absl::string_view name) {
  std::ifstream in(absl::StrCat("/proc/net/dev_snmp6/", netdev));
  std::string key;
  int64_t value = 0;
  while (in >> key >> value) {
    if (key == name) return value;
  }
  return -1;
}

class VerbsIpv6Test : public ::testing::Test {
 protected:
  void SetUp() override {
    struct stat info;
    if (stat("/sys/class/infiniband", &info) != 0) {
      GTEST_SKIP() << "no RDMA device: /sys/class/infiniband is absent (run "
                      "scripts/rdma-vm.sh)";
    }
    if (Rails6().empty()) {
      GTEST_SKIP() << "FUSELINK_RDMA_RAILS6 is not set (scripts/rdma-vm.sh sets it in "
                      "its VM)";
    }
  }

  VerbsFabricOptions Options(std::string name, bool a_side, int nic_count) {
    VerbsFabricOptions options;
    options.keys = keys_.For(name);
    options.node_name = std::move(name);
    const std::vector<Rail> rails = Rails6();
    for (int nic = 0; nic < nic_count; ++nic) {
      options.nics.push_back(
          {.nic = nic, .address = a_side ? rails[nic].a : rails[nic].b});
    }
    options.qps_per_peer_nic = 2;
    options.rc.timeout = 14;   // ~67 ms per try
    options.rc.retry_cnt = 3;  // a dead path fails in well under a second
    return options;
  }

  // Posts on a, waiting out RESOURCE_EXHAUSTED (back-pressure).
  absl::Status Post(int nic, const WriteOp& op) {
    while (true) {
      absl::Status posted = a_->PostWrite(b_on_a_, nic, op);
      if (posted.code() != absl::StatusCode::kResourceExhausted) return posted;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  testing::KeyRing keys_;  // outlives the fabrics
  testing::Buffers buffers_;
  testing::RecordingHandler a_events_;
  testing::RecordingHandler b_events_;
  std::unique_ptr<Fabric> a_;
  std::unique_ptr<Fabric> b_;
  PeerId b_on_a_ = 0;
};

// Each IPv6 address binds to the RoCE v2 GID that is the address itself, on the port
// and netdev of the rail, beside (not instead of) the IPv4 GID of the same port.
TEST_F(VerbsIpv6Test, DiscoveryPicksTheIpv6RoceV2GidOfEachAddress) {
  const std::vector<Rail> rails6 = Rails6();
  const std::vector<Rail> rails4 = testing::RailsFrom("FUSELINK_RDMA_RAILS");
  for (size_t i = 0; i < rails6.size(); ++i) {
    const Rail& rail = rails6[i];
    for (const std::string& address : {rail.a, rail.b}) {
      absl::StatusOr<verbs::NicBinding> binding = verbs::BindAddress(address);
      ASSERT_TRUE(binding.ok()) << address << ": " << binding.status();
      const std::string base = absl::StrCat(
          "/sys/class/infiniband/", binding->port.device, "/ports/", binding->port.port);
      std::string gid, type;
      std::getline(std::ifstream(absl::StrCat(base, "/gids/", binding->gid_index)), gid);
      std::getline(
          std::ifstream(absl::StrCat(base, "/gid_attrs/types/", binding->gid_index)),
          type);
      EXPECT_TRUE(SameGid(binding->gid, Parse6(address))) << address;
      EXPECT_TRUE(SameGid(Parse6(gid), Parse6(address))) << gid << " vs " << address;
      EXPECT_EQ(type, "RoCE v2");
      EXPECT_EQ(binding->port.link_layer, IBV_LINK_LAYER_ETHERNET);
      std::printf("discovery6: %s -> %s port %d GID index %u (%s, %s) netdev %s\n",
                  address.c_str(), binding->port.device.c_str(), binding->port.port,
                  binding->gid_index, gid.c_str(), type.c_str(), binding->netdev.c_str());
      const std::string& veth = address == rail.a ? rail.a_veth : rail.b_veth;
      if (!veth.empty()) {
        EXPECT_EQ(binding->netdev, veth);
        EXPECT_EQ(binding->port.netdev, veth);
      }
      if (i < rails4.size()) {
        const std::string& ipv4 = address == rail.a ? rails4[i].a : rails4[i].b;
        absl::StatusOr<verbs::NicBinding> v4 = verbs::BindAddress(ipv4);
        ASSERT_TRUE(v4.ok()) << ipv4 << ": " << v4.status();
        EXPECT_EQ(v4->port.device, binding->port.device) << ipv4 << " vs " << address;
        EXPECT_NE(v4->gid_index, binding->gid_index);
        EXPECT_EQ(verbs::GidToString(v4->gid), absl::StrCat("::ffff:", ipv4));
      }
    }
  }
  std::vector<std::string> all;
  for (const Rail& rail : rails6) all.push_back(rail.a);
  EXPECT_TRUE(verbs::VerbsAvailable(all));
  // Documentation prefix: on no device.
  EXPECT_EQ(verbs::BindAddress("2001:db8::1").status().code(),
            absl::StatusCode::kNotFound);
  all.push_back("2001:db8::1");
  EXPECT_FALSE(verbs::VerbsAvailable(all));
  // The rail's own link-local address has a RoCE v2 GID too (rxe's default GID), but
  // is refused: it needs a scope id and does not route between nodes.
  absl::StatusOr<std::vector<Ipv6InterfaceAddress>> listed = ListIpv6Interfaces();
  ASSERT_TRUE(listed.ok()) << listed.status();
  int link_locals = 0;
  for (const Ipv6InterfaceAddress& a : *listed) {
    if (a.scope_id == 0 || (a.name != rails6[0].a_veth && a.name != rails6[0].b_veth)) {
      continue;
    }
    ++link_locals;
    absl::Status refused = verbs::BindAddress(a.ipv6).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << a.ipv6;
    EXPECT_EQ(ReasonOf(refused), "LINK_LOCAL_ADDRESS") << a.ipv6;
    std::printf("discovery6: %s (%s) -> %s\n", a.ipv6.c_str(), a.name.c_str(),
                refused.ToString().c_str());
  }
  if (!rails6[0].a_veth.empty()) {
    EXPECT_GT(link_locals, 0) << "no link-local address on " << rails6[0].a_veth;
  }
}

// Two fabrics over the IPv6 rails: every NIC carries writes through a window, the bytes
// land exactly, and they crossed the rails as IPv6 (the receiving interfaces' IPv6
// counters grew by at least the payload).
TEST_F(VerbsIpv6Test, WritesOverIpv6GidsLandOnEveryNic) {
  const std::vector<Rail> rails = Rails6();
  const int nic_count = static_cast<int>(std::min<size_t>(rails.size(), 2));
  auto a = CreateVerbsFabric(Options("a", true, nic_count), &a_events_);
  ASSERT_TRUE(a.ok()) << a.status();
  a_ = *std::move(a);
  auto b = CreateVerbsFabric(Options("b", false, nic_count), &b_events_);
  ASSERT_TRUE(b.ok()) << b.status();
  b_ = *std::move(b);
  for (const Endpoint& e : b_->endpoints()) {
    EXPECT_NE(e.address.find(':'), std::string::npos) << e.address;
  }
  absl::StatusOr<PeerId> peer = a_->Connect("b", b_->endpoints());
  ASSERT_TRUE(peer.ok()) << peer.status();
  b_on_a_ = *peer;

  constexpr uint32_t kWriteBytes = 64 << 10;
  constexpr int kWritesPerNic = 8;
  const size_t total = size_t{kWriteBytes} * kWritesPerNic * nic_count;
  std::vector<uint8_t>& source = buffers_.Keep(testing::ManyBytes(total, 6));
  std::vector<uint8_t>& target = buffers_.Keep(std::vector<uint8_t>(total, kUntouched));
  absl::StatusOr<RegionKey> from = a_->RegisterRegion(source.data(), total, nullptr);
  ASSERT_TRUE(from.ok()) << from.status();
  absl::StatusOr<RegionKey> into = b_->RegisterRegion(target.data(), total, nullptr);
  ASSERT_TRUE(into.ok()) << into.status();
  absl::StatusOr<WindowKey> window =
      b_->OpenWindow(*into, "a", std::vector<Extent>{{0, total}});
  ASSERT_TRUE(window.ok()) << window.status();

  std::vector<int64_t> in_octets_before;
  for (const Rail& rail : rails) {
    in_octets_before.push_back(
        rail.b_veth.empty() ? -1 : Ipv6Counter(rail.b_veth, "Ip6InOctets"));
  }
  uint64_t wr_id = 0;
  for (int i = 0; i < kWritesPerNic * nic_count; ++i) {
    const int nic = i % nic_count;
    const uint64_t offset = uint64_t{kWriteBytes} * i;
    absl::Status posted = Post(nic, {.local_key = *from,
                                     .local_offset = offset,
                                     .remote_key = *window,
                                     .remote_offset = offset,
                                     .bytes = kWriteBytes,
                                     .imm = static_cast<uint32_t>(i),
                                     .wr_id = wr_id++});
    ASSERT_TRUE(posted.ok()) << posted;
  }
  ASSERT_TRUE(a_events_.WaitForCompletions(wr_id));
  std::map<uint64_t, int> seen;
  for (const Completion& c : a_events_.completions()) {
    EXPECT_TRUE(c.status.ok()) << "wr_id " << c.wr_id << ": " << c.status;
    ++seen[c.wr_id];
  }
  EXPECT_EQ(seen.size(), wr_id);
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << "wr_id " << id;
  ASSERT_TRUE(b_events_.WaitForArrivals(wr_id));
  for (const Arrival& arrival : b_events_.arrivals()) {
    EXPECT_EQ(arrival.window, *window);
    EXPECT_EQ(arrival.offset, uint64_t{kWriteBytes} * arrival.imm);
  }
  ASSERT_EQ(std::memcmp(target.data(), source.data(), total), 0) << "bytes differ";
  for (int nic = 0; nic < nic_count; ++nic) {
    const uint64_t expected = uint64_t{kWriteBytes} * kWritesPerNic;
    EXPECT_EQ(a_->counters(nic).transmitted_bytes, expected) << "NIC " << nic;
    EXPECT_EQ(b_->counters(nic).received_bytes, expected) << "NIC " << nic;
    if (in_octets_before[nic] < 0) continue;
    const int64_t grew =
        Ipv6Counter(rails[nic].b_veth, "Ip6InOctets") - in_octets_before[nic];
    std::printf("ipv6: NIC %d %s -> %s: %llu bytes written, %s Ip6InOctets +%lld\n", nic,
                rails[nic].a.c_str(), rails[nic].b.c_str(),
                static_cast<unsigned long long>(expected), rails[nic].b_veth.c_str(),
                static_cast<long long>(grew));
    EXPECT_GE(grew, static_cast<int64_t>(expected)) << rails[nic].b_veth;
  }
  a_.reset();  // every QP to ERR, drained, destroyed
  ASSERT_TRUE(a_events_.WaitForPeersLost(1));
  ASSERT_TRUE(b_events_.WaitForPeersLost(1));
  b_.reset();
}

}  // namespace
}  // namespace fuselink::fabric
