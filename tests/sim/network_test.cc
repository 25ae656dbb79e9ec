// The simulator's network: the agent's scheduler against modelled rails. Exact times
// where the model makes them exact, and the scheduler's rules where they decide.
#include "tools/sim/network.h"

#include "gtest/gtest.h"

namespace fuselink::sim {
namespace {

constexpr uint64_t kMiB = 1 << 20;

NetworkModel Model(sched::Policy policy, int nodes = 2) {
  NetworkModel m;
  m.nodes = nodes;
  m.policy = policy;
  m.rail_bytes_per_s = 100e6;
  m.latency_s = 1e-4;
  return m;
}

TEST(SimNetworkTest, StaticSendsBackToBackOnTheDirectNic) {
  const NetworkModel m = Model(sched::Policy::kStatic);
  Network net(m);
  const FlowResult r = net.Run({Flow{0, 2, 1, 64 * kMiB, 0.5}})[0];
  const double chunk_s = static_cast<double>(kMiB) / m.rail_bytes_per_s;
  EXPECT_DOUBLE_EQ(r.start_s, 0.5);
  EXPECT_NEAR(r.seconds(), 64 * chunk_s + 2 * m.latency_s, 1e-9);
  EXPECT_EQ(r.nic_bytes, (std::vector<uint64_t>{0, 0, 64 * kMiB, 0}));
  EXPECT_EQ(net.chunks(), 64u);
}

TEST(SimNetworkTest, ALastChunkCarriesOnlyWhatIsLeft) {
  Network net(Model(sched::Policy::kStatic));
  const FlowResult r = net.Run({Flow{0, 0, 1, 2 * kMiB + 5, 0}})[0];
  EXPECT_EQ(r.nic_bytes[0], 2 * kMiB + 5);
  EXPECT_EQ(net.chunks(), 3u);
}

TEST(SimNetworkTest, StripeAndALoneFuselinkTransferUseEveryRail) {
  for (sched::Policy p : {sched::Policy::kStripe, sched::Policy::kFuselink}) {
    SCOPED_TRACE(std::string(sched::PolicyName(p)));
    const NetworkModel m = Model(p);
    Network net(m);
    const FlowResult r = net.Run({Flow{0, 0, 1, 256 * kMiB, 0}})[0];
    const double alone_s = 256 * static_cast<double>(kMiB) / m.rail_bytes_per_s;
    EXPECT_LT(r.seconds(), alone_s / 3.5);
    for (int k = 0; k < 4; ++k) EXPECT_GT(r.nic_bytes[k], 0u) << "NIC " << k;
  }
}

TEST(SimNetworkTest, FuselinkGivesANicBackWhenItsOwnerSends) {
  // GPU 0's transfer starts first and borrows every idle NIC; at the same instant GPU 1
  // starts one that outlasts it. Of NIC 1, GPU 0 keeps only the chunks already in
  // flight there (borrow_depth of them); it shares NICs 2 and 3 with GPU 1.
  const NetworkModel m = Model(sched::Policy::kFuselink);
  Network net(m);
  const std::vector<FlowResult> r =
      net.Run({Flow{0, 0, 1, 64 * kMiB, 0}, Flow{0, 1, 1, 512 * kMiB, 0}});
  EXPECT_EQ(r[0].nic_bytes[1], m.limits.borrow_depth * kMiB);
  EXPECT_GT(r[0].nic_bytes[2] + r[0].nic_bytes[3], 0u);
  EXPECT_GT(r[1].nic_bytes[2] + r[1].nic_bytes[3], 0u);
  EXPECT_LT(r[0].end_s, r[1].end_s);
}

TEST(SimNetworkTest, FuselinkLendsNoRailWhoseReceiverTakesItsOwnersTraffic) {
  // Node 1's GPU 2 sends to node 2 on rail 2: node 2 reports rail 2 busy, so node 0's
  // hot transfer to node 2 borrows rails 1 and 3 only.
  Network net(Model(sched::Policy::kFuselink, 3));
  const std::vector<FlowResult> r =
      net.Run({Flow{1, 2, 2, 512 * kMiB, 0}, Flow{0, 0, 2, 64 * kMiB, 0.01}});
  EXPECT_EQ(r[1].nic_bytes[2], 0u);
  EXPECT_GT(r[1].nic_bytes[1], 0u);
  EXPECT_GT(r[1].nic_bytes[3], 0u);
}

TEST(SimNetworkTest, FlowsAddedAsOthersEndStartThen) {
  Network net(Model(sched::Policy::kStatic));
  int added = 0;
  const std::vector<FlowResult> r =
      net.Run({Flow{0, 0, 1, 8 * kMiB, 0}}, [&](size_t, Network& n) {
        if (added++ < 2) n.Add(Flow{0, 0, 1, 8 * kMiB, 0});  // starts now, not at 0
      });
  ASSERT_EQ(r.size(), 3u);
  EXPECT_DOUBLE_EQ(r[1].start_s, r[0].end_s);
  EXPECT_DOUBLE_EQ(r[2].start_s, r[1].end_s);
}

}  // namespace
}  // namespace fuselink::sim
