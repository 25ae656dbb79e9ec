#include "agent/topo/topology.h"

#include "agent/common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fuselink::topo {
namespace {

using ::testing::HasSubstr;

TEST(Topology, ParsesAFileAndNumbersNics) {
  auto t = ParseTopologyJson(R"({
    "gpus": [{"index": 0}, {"index": 1}],
    "nics": [{"name": "mlx5_0", "address": "10.0.0.1", "owner_gpu": 1,
              "rate_bytes_per_s": "50000000000"},
             {"name": "mlx5_1", "address": "10.0.1.1", "owner_gpu": 0}]})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nics(1).index(), 1u);
  EXPECT_EQ(DirectNic(*t, 0), 1);
  EXPECT_EQ(DirectNic(*t, 1), 0);
}

TEST(Topology, RejectsBadFiles) {
  for (
      const char* bad : {
          R"({"nics": []})",
          R"({"nics": [{"name": "a", "address": "not-an-ip"}]})",
          R"({"nics": [{"name": "a", "address": "fe80::1"}]})",  // link-local
          R"({"nics": [{"name": "a", "address": "ff02::1"}]})",  // multicast
          R"({"nics": [{"name": "a", "address": "::ffff:10.0.0.1"}]})",
          R"({"nics": [{"name": "a", "address": "1.2.3.4", "owner_gpu": 3}]})",
          R"({"nics": [{"name": "a", "address": "1.2.3.4"}, {"name": "a", "address": "1.2.3.5"}]})",
          R"({"nics": [{"name": "a", "address": "1.2.3.4", "speed": 1}]})",
          R"({not json)",
      }) {
    auto t = ParseTopologyJson(bad);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(ReasonOf(t.status()), "BAD_TOPOLOGY") << bad;
  }
}

TEST(Topology, NicsMayHaveGlobalIpv6Addresses) {
  absl::StatusOr<Topology> t = ParseTopologyJson(
      R"({"nics": [{"name": "a", "address": "fd00:fe:0::1"}, {"name": "b", "address": "10.0.0.1"}]})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nics(0).address(), "fd00:fe:0::1");
  EXPECT_TRUE(IsNicAddress("2001:db8::7"));
  EXPECT_FALSE(IsNicAddress("::"));
  EXPECT_FALSE(IsNicAddress("10.0.0.1:80"));
}

TEST(Topology, EmulatedNodeHasOneGpuPerNic) {
  Topology t = EmulatedTopology(4, 7, 0);
  ASSERT_TRUE(ValidateTopology(t).ok());
  EXPECT_EQ(t.nics(3).address(), "127.0.7.4");
  EXPECT_EQ(DirectNic(t, 2), 2);
}

}  // namespace
}  // namespace fuselink::topo

namespace fuselink::topo {
namespace {

TEST(Topology, FilesMayCarryDiscoveredFields) {
  auto t = ParseTopologyJson(R"({
    "gpus": [{"index": 0, "pci_bus_id": "0000:1b:00.0", "numa_node": 0, "direct_nic": 1,
              "peer_gpus": [1]},
             {"index": 1}],
    "nics": [{"name": "mlx5_0", "address": "10.0.0.1", "owner_gpu": 1,
              "gpu_distance": ["PATH_CLASS_SYS", "PATH_CLASS_PIX"]},
             {"name": "mlx5_1", "address": "10.0.1.1", "rdma_device": "mlx5_1",
              "link_layer": "InfiniBand"}],
    "excluded_nics": [{"name": "mlx5_4", "reason": "MANAGEMENT"}]})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nics(0).gpu_distance(1), v1::PATH_CLASS_PIX);
  EXPECT_EQ(DirectNic(*t, 0), 1);  // direct_nic wins over ownership
  EXPECT_EQ(DirectNic(*t, 1), 0);  // no direct_nic: the NIC it owns
  for (const char* bad : {
           R"({"gpus": [{"index": 0, "direct_nic": 2}],
               "nics": [{"name": "a", "address": "1.2.3.4"}]})",
           R"({"gpus": [{"index": 0}, {"index": 1}],
               "nics": [{"name": "a", "address": "1.2.3.4", "gpu_distance": ["PATH_CLASS_PIX"]}]})",
       }) {
    EXPECT_EQ(ReasonOf(ParseTopologyJson(bad).status()), "BAD_TOPOLOGY") << bad;
  }
}

TEST(Topology, RailsAreTheDiscoveredKeyElseTheIndexAndUnique) {
  auto t = ParseTopologyJson(R"({
    "nics": [{"name": "a", "address": "10.0.0.1", "rail": 0},
             {"name": "b", "address": "10.0.1.1", "rail": 3},
             {"name": "c", "address": "10.0.2.1"}]})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(Rails(*t), (std::vector<uint32_t>{0, 3, 2}));  // c: no rail, its index
  EXPECT_EQ(Rails(EmulatedTopology(3, 1, 0)), (std::vector<uint32_t>{0, 1, 2}));
  auto twice = ParseTopologyJson(R"({
    "nics": [{"name": "a", "address": "10.0.0.1", "rail": 1},
             {"name": "b", "address": "10.0.1.1"}]})");
  EXPECT_EQ(ReasonOf(twice.status()), "BAD_TOPOLOGY");
  EXPECT_THAT(std::string(twice.status().message()), HasSubstr("rail 1"));
}

// Peers pair NIC i with NIC i (agent/peer/peer_directory.cc): the check that keeps a
// node that lost a port from pairing rails of different subnets.
TEST(Topology, RailPairingRefusesDifferentRailsAtAnIndexNamingThem) {
  EXPECT_TRUE(CheckRailPairing("b", {0, 1, 2, 3}, {0, 1, 2, 3}).ok());
  // Two nodes, each with a different port down: same count, different rails.
  absl::Status s = CheckRailPairing("b", {0, 1, 3}, {0, 2, 3});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(s), "RAIL_MISMATCH");
  EXPECT_THAT(std::string(s.message()), HasSubstr("node 'b' has rails [0,2,3]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("this node [0,1,3]"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("NIC 1 is rail 1 here and rail 2 there"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--exclude_nics"));
  // One node with a port down: a different count.
  s = CheckRailPairing("b", {0, 1, 2, 3}, {0, 1, 3});
  EXPECT_EQ(ReasonOf(s), "RAIL_MISMATCH");
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("NIC 2 is rail 2 here and rail 3 there"));
  s = CheckRailPairing("b", {0, 1, 2}, {0, 1});
  EXPECT_EQ(ReasonOf(s), "RAIL_MISMATCH");
  EXPECT_THAT(std::string(s.message()), HasSubstr("[0,1] and this node [0,1,2]"));
}

TEST(Topology, SourceSaysWhereItCameFrom) {
  EXPECT_EQ(EmulatedTopology(1, 1, 0).source(), "emulated");
}

}  // namespace
}  // namespace fuselink::topo
