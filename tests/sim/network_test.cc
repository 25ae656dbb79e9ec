// The simulator's network: the agent's scheduler against modelled rails. Exact times
// where the model makes them exact, and the scheduler's rules where they decide.
#include "tools/sim/network.h"

#include <algorithm>

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

// Three nodes send to one receiver's NIC 0 at once: it takes their chunks one after
// another. A sender's NIC is not held while its chunk waits for the receiver's: node
// 0's NIC 0 also carries a flow to node 4, whose NIC nobody else uses, and stays busy
// throughout, so that flow ends when node 0 has sent its last chunk.
TEST(SimNetworkTest, SendersToOneReceiverShareItWithoutHoldingTheirOwnNics) {
  const NetworkModel m = Model(sched::Policy::kStatic, 5);
  Network net(m);
  const std::vector<FlowResult> r =
      net.Run({Flow{1, 0, 2, 16 * kMiB, 0}, Flow{3, 0, 2, 16 * kMiB, 0},
               Flow{0, 0, 2, 16 * kMiB, 0}, Flow{0, 0, 4, 32 * kMiB, 0}});
  const double chunk_s = static_cast<double>(kMiB) / m.rail_bytes_per_s;
  EXPECT_NEAR(std::max({r[0].end_s, r[1].end_s, r[2].end_s}),
              48 * chunk_s + 2 * m.latency_s, 2 * chunk_s);
  EXPECT_NEAR(r[3].end_s, 48 * chunk_s + 2 * m.latency_s, 2 * chunk_s);
}

// Two senders' chunks reach one receiving NIC together. A shared port gives each half
// its rate, so both land after two chunk times; a FIFO port lands the one posted first
// after one.
TEST(SimNetworkTest, ASharedPortSplitsItsRateAndAFifoPortTakesTurns) {
  for (Receiver receiver : {Receiver::kShared, Receiver::kFifo}) {
    SCOPED_TRACE(receiver == Receiver::kShared ? "shared" : "fifo");
    NetworkModel m = Model(sched::Policy::kStatic, 3);
    m.receiver = receiver;
    Network net(m);
    const std::vector<FlowResult> r =
        net.Run({Flow{0, 1, 2, kMiB, 0}, Flow{1, 1, 2, kMiB, 0}});
    const double chunk_s = static_cast<double>(kMiB) / m.rail_bytes_per_s;
    const double first = receiver == Receiver::kShared ? 2 * chunk_s : chunk_s;
    EXPECT_NEAR(r[0].end_s, first + 2 * m.latency_s, 1e-9);
    EXPECT_NEAR(r[1].end_s, 2 * chunk_s + 2 * m.latency_s, 1e-9);
  }
}

// A chunk that arrives half-way through another's: the first has had half its bytes
// alone, needs one more chunk time at half the rate, and lands at 1.5; the second has
// had half by then and lands alone at 2.
TEST(SimNetworkTest, ASharedPortServesAChunkAloneUntilAnotherArrives) {
  NetworkModel m = Model(sched::Policy::kStatic, 3);
  m.receiver = Receiver::kShared;
  Network net(m);
  const double chunk_s = static_cast<double>(kMiB) / m.rail_bytes_per_s;
  const std::vector<FlowResult> r =
      net.Run({Flow{0, 1, 2, kMiB, 0}, Flow{1, 1, 2, kMiB, chunk_s / 2}});
  EXPECT_NEAR(r[0].end_s, 1.5 * chunk_s + 2 * m.latency_s, 1e-9);
  EXPECT_NEAR(r[1].end_s, 2 * chunk_s + 2 * m.latency_s, 1e-9);
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

// The links inside a node. Rails of 100 MB/s, chunks of 1 MiB; every time below is a
// sum of bytes / rate over the stages a chunk crosses, plus two latencies.

TEST(SimLinksTest, ABorrowedChunkCrossesNvlinkIntoTheRelayThenItsNic) {
  NetworkModel m = Model(sched::Policy::kFuselink);
  m.nics = 2;
  m.limits.direct_depth = 0;  // every chunk borrows: NIC 1, GPU 1 is its relay
  m.links.nvlink_egress_bytes_per_s = 400e6;
  const double chunk = static_cast<double>(kMiB);
  {
    // To GPU 1 there: it lands on its own GPU's NIC, no forwarding.
    Network net(m);
    const FlowResult r = net.Run({Flow{0, 0, 1, kMiB, 0, /*dst_gpu=*/1}})[0];
    EXPECT_EQ(r.nic_bytes, (std::vector<uint64_t>{0, kMiB}));
    EXPECT_NEAR(r.seconds(), chunk / 400e6 + chunk / 100e6 + 2 * m.latency_s, 1e-12);
  }
  {
    // To GPU 0 there: NIC 1's owner forwards it over NVLink, a second copy.
    Network net(m);
    const FlowResult r = net.Run({Flow{0, 0, 1, kMiB, 0}})[0];
    EXPECT_NEAR(r.seconds(), 2 * chunk / 400e6 + chunk / 100e6 + 2 * m.latency_s, 1e-12);
  }
}

TEST(SimLinksTest, ADirectChunkCrossesPcieOnBothEndsAndNoNvlink) {
  NetworkModel m = Model(sched::Policy::kStatic);
  m.links.pcie_bytes_per_s = 200e6;
  m.links.nvlink_egress_bytes_per_s = 1e3;  // would take 1000 s if it were crossed
  Network net(m);
  const FlowResult r = net.Run({Flow{0, 3, 1, kMiB, 0}})[0];
  const double chunk = static_cast<double>(kMiB);
  EXPECT_NEAR(r.seconds(),
              chunk / 200e6 + chunk / 100e6 + chunk / 200e6 + 2 * m.latency_s, 1e-12);
}

TEST(SimLinksTest, TheNvlinkEgressBoundsWhatOneGpuRelays) {
  // GPU 0 alone with 4 NICs: its own NIC at 100 MB/s, and the three it borrows fed
  // through its NVLink egress at 50 MB/s together.
  NetworkModel m = Model(sched::Policy::kFuselink);
  m.window_chunks = 64;
  m.links.nvlink_egress_bytes_per_s = 50e6;
  Network net(m);
  const FlowResult r = net.Run({Flow{0, 0, 1, 256 * kMiB, 0}})[0];
  const double relayed =
      static_cast<double>(r.nic_bytes[1] + r.nic_bytes[2] + r.nic_bytes[3]);
  EXPECT_LE(relayed / r.seconds(), 50e6);
  EXPECT_GE(relayed / r.seconds(), 0.9 * 50e6);
  // Within a few per cent of 150 MB/s (the rest: the first and last chunks' trips);
  // without the cap it would be 400.
  EXPECT_NEAR(static_cast<double>(256 * kMiB) / r.seconds(), 150e6, 0.05 * 150e6);
}

TEST(SimLinksTest, TheNvlinkTotalBoundsWhatAllGpusRelay) {
  // GPUs 0 and 1 both borrow every chunk (direct_depth 0), so all 64 MiB cross
  // NVLink, through the node's switch at 50 MB/s, though each GPU's own NVLink and
  // the rails could take far more.
  NetworkModel m = Model(sched::Policy::kFuselink);
  m.limits.direct_depth = 0;
  m.links.nvlink_total_bytes_per_s = 50e6;
  Network net(m);
  const std::vector<FlowResult> r =
      net.Run({Flow{0, 0, 1, 32 * kMiB, 0, 2}, Flow{0, 1, 1, 32 * kMiB, 0, 3}});
  EXPECT_EQ(r[0].nic_bytes[0], 0u);
  EXPECT_EQ(r[1].nic_bytes[1], 0u);
  const double end_s = std::max(r[0].end_s, r[1].end_s);
  EXPECT_GE(end_s, 64 * static_cast<double>(kMiB) / 50e6);
  // The last chunk out of the switch then crosses the rail and, at worst behind one
  // other, the receiver's switch.
  const double chunk = static_cast<double>(kMiB);
  EXPECT_LE(end_s,
            64 * chunk / 50e6 + chunk / 100e6 + 2 * chunk / 50e6 + 2 * m.latency_s);
}

TEST(SimLinksTest, AGpusPcieCarriesItsOwnChunksAndThoseItRelays) {
  // Stripe, GPUs 0 and 1 each 32 MiB over NICs 0 and 1. PCIe (50 MB/s) is slower than
  // a rail: each GPU's link carries its own chunks and the other's relayed ones, 32
  // MiB each, back to back; the last chunk then crosses the rail and PCIe again.
  NetworkModel m = Model(sched::Policy::kStripe);
  m.nics = 2;
  m.links.pcie_bytes_per_s = 50e6;
  Network net(m);
  const std::vector<FlowResult> r =
      net.Run({Flow{0, 0, 1, 32 * kMiB, 0}, Flow{0, 1, 1, 32 * kMiB, 0}});
  EXPECT_EQ(r[0].nic_bytes[0] + r[1].nic_bytes[0], 32 * kMiB);
  EXPECT_GT(r[0].nic_bytes[1], 0u);  // relayed through GPU 1
  const double chunk = static_cast<double>(kMiB);
  EXPECT_NEAR(std::max(r[0].end_s, r[1].end_s),
              32 * chunk / 50e6 + chunk / 100e6 + chunk / 50e6 + 2 * m.latency_s, 1e-9);
}

// Above the switches. NIC k under bridge k, NIC 1 on the second socket.
NetworkModel Tree(sched::Policy policy) {
  NetworkModel m = Model(policy);
  m.nics = 2;
  m.links.host_bridge_bytes_per_s = 200e6;
  m.links.socket_bytes_per_s = 50e6;
  m.links.nics_per_bridge = 1;
  m.links.nics_per_socket = 1;
  return m;
}

TEST(SimLinksTest, AHostTensorGoesDownTheNicsBridgeAndAcrossTheSocketLink) {
  NetworkModel m = Tree(sched::Policy::kStatic);
  m.links.pcie_bytes_per_s = 1e3;  // would take 1000 s if it were crossed
  // GPU 1's engine sends from host memory on socket 0 into host memory on socket 1:
  // down NIC 1's bridge through the socket link (the slower, 50 MB/s), the rail, up
  // the receiver's bridge into its own socket's memory.
  Flow f{0, 1, 1, kMiB, 0};
  f.src_host_socket = 0;
  f.dst_host_socket = 1;
  Network net(m);
  const FlowResult r = net.Run({f})[0];
  const double chunk = static_cast<double>(kMiB);
  EXPECT_EQ(r.nic_bytes, (std::vector<uint64_t>{0, kMiB}));
  EXPECT_NEAR(r.seconds(), chunk / 50e6 + chunk / 100e6 + chunk / 200e6 + 2 * m.latency_s,
              1e-12);
}

TEST(SimLinksTest, APcieRelayCrossesTheBridgesAndSocketsBetweenItsGpus) {
  NetworkModel m = Tree(sched::Policy::kFuselink);
  m.limits.direct_depth = 0;  // every chunk borrows: NIC 1, GPU 1 is its relay
  m.links.relay_over_pcie = true;
  m.links.pcie_bytes_per_s = 400e6;
  m.links.nvlink_egress_bytes_per_s = 1e3;  // would take 1000 s if it were crossed
  const double chunk = static_cast<double>(kMiB);
  // The relay copy holds GPU 0's link, both bridges and the socket link at once: the
  // socket link's 50 MB/s. Then GPU 1's link out, the rail, GPU 1's link in there.
  const double after_relay = chunk / 400e6 + chunk / 100e6 + chunk / 400e6;
  {
    Network net(m);
    const FlowResult r = net.Run({Flow{0, 0, 1, kMiB, 0, /*dst_gpu=*/1}})[0];
    EXPECT_EQ(r.nic_bytes, (std::vector<uint64_t>{0, kMiB}));
    EXPECT_NEAR(r.seconds(), chunk / 50e6 + after_relay + 2 * m.latency_s, 1e-12);
  }
  {
    // Both GPUs under one bridge on one socket: the copy stays in their switch.
    m.links.nics_per_bridge = 2;
    m.links.nics_per_socket = 0;
    Network net(m);
    const FlowResult r = net.Run({Flow{0, 0, 1, kMiB, 0, /*dst_gpu=*/1}})[0];
    EXPECT_NEAR(r.seconds(), chunk / 400e6 + after_relay + 2 * m.latency_s, 1e-12);
  }
}

}  // namespace
}  // namespace fuselink::sim
