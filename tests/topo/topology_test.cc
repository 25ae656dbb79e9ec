#include "agent/topo/topology.h"

#include "agent/common/status_macros.h"
#include "gtest/gtest.h"

namespace fuselink::topo {
namespace {

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

TEST(Topology, EmulatedNodeHasOneGpuPerNic) {
  Topology t = EmulatedTopology(4, 7, 0);
  ASSERT_TRUE(ValidateTopology(t).ok());
  EXPECT_EQ(t.nics(3).address(), "127.0.7.4");
  EXPECT_EQ(DirectNic(t, 2), 2);
}

}  // namespace
}  // namespace fuselink::topo
