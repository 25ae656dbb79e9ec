// The foreign-traffic watch on a sysfs tree built here and a scripted interface
// list: which NICs it watches and why not, RDMA port counters, and the busy masks
// it derives from counters that move (or not) beside fuselink's own bytes.
#include "agent/nicstat/foreign_watch.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "gtest/gtest.h"

namespace fuselink::nicstat {
namespace {

namespace fs = std::filesystem;

class FakeSysfs {
 public:
  FakeSysfs() {
    char dir[] = "/tmp/nicstat-test.XXXXXX";
    root_ = mkdtemp(dir);
  }
  ~FakeSysfs() { fs::remove_all(root_); }
  const std::string& root() const { return root_; }
  void Write(const std::string& relative, const std::string& text) const {
    const fs::path p = fs::path(root_) / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  void Netdev(const std::string& name, uint64_t tx, uint64_t rx) const {
    Write(absl::StrCat("class/net/", name, "/statistics/tx_bytes"),
          absl::StrCat(tx, "\n"));
    Write(absl::StrCat("class/net/", name, "/statistics/rx_bytes"),
          absl::StrCat(rx, "\n"));
  }

 private:
  std::string root_;
};

std::vector<WatchedNic> TwoNics() {
  return {{"rail0", "10.0.0.1", 125'000'000}, {"rail1", "10.0.1.1", 125'000'000}};
}

ForeignWatch::ListFn Interfaces(std::vector<InterfaceAddress> list) {
  return [list] { return absl::StatusOr<std::vector<InterfaceAddress>>(list); };
}

// Own bytes that stay as they are between the two reads of a look.
auto Steady(std::span<const OwnBytes> own) {
  return [own](std::span<OwnBytes> out) {
    for (size_t k = 0; k < out.size() && k < own.size(); ++k) out[k] = own[k];
  };
}

ForeignOptions Options(const FakeSysfs& sys) {
  ForeignOptions o;
  o.sysfs_root = sys.root();
  o.header_overhead_fraction = 0;
  o.ack_overhead_fraction = 0;
  o.window = absl::Milliseconds(50);
  o.hold = absl::Milliseconds(100);
  return o;
}

TEST(ForeignWatch, TheLoopbackIsNotWatched) {
  FakeSysfs sys;
  sys.Netdev("lo", 0, 0);
  auto w = ForeignWatch::Create({{"nic0", "127.0.1.1", 1'000'000'000}}, Options(sys),
                                Interfaces({{"lo", "127.0.1.1", true}}));
  EXPECT_FALSE(w->watched(0));
  EXPECT_FALSE(w->any_watched());
  EXPECT_TRUE(absl::StrContains(w->why(0), "loopback")) << w->why(0);
  EXPECT_TRUE(absl::StrContains(w->Describe(), "nic0: off")) << w->Describe();
  // The emulated node's addresses are the loopback's subnet, not its address.
  auto routed = ForeignWatch::Create(
      {{"nic0", "127.0.1.1", 1'000'000'000}, {"nic1", "10.9.0.1", 1'000'000'000}},
      Options(sys),
      Interfaces({{"lo", "127.0.0.1", true, 8}, {"eth9", "10.9.0.2", false, 24}}));
  EXPECT_TRUE(absl::StrContains(routed->why(0), "loopback")) << routed->why(0);
  // A subnet match is the loopback's privilege: another interface's is no match.
  EXPECT_TRUE(absl::StrContains(routed->why(1), "no interface")) << routed->why(1);
}

TEST(ForeignWatch, BracketCountsWhatStartedBetweenTheReads) {
  const OwnBytes before{.tx = 100, .rx = 50, .tx_slack = 10, .rx_slack = 20};
  const OwnBytes after{.tx = 130, .rx = 50, .tx_slack = 5, .rx_slack = 7};
  const OwnBytes o = Bracket(before, after);
  EXPECT_EQ(o.tx, 100u);
  EXPECT_EQ(o.rx, 50u);
  EXPECT_EQ(o.tx_slack, 10u + 5u + 30u);
  EXPECT_EQ(o.rx_slack, 20u + 7u);
}

TEST(ForeignWatch, NicsSharingANetdevAreNotWatched) {
  FakeSysfs sys;
  sys.Netdev("eth0", 0, 0);
  sys.Netdev("eth1", 0, 0);
  std::vector<WatchedNic> nics = TwoNics();
  nics.push_back({"rail2", "10.0.2.1", 125'000'000});
  auto w = ForeignWatch::Create(nics, Options(sys),
                                Interfaces({{"eth0", "10.0.0.1", false},
                                            {"eth0", "10.0.1.1", false},
                                            {"eth1", "10.0.2.1", false}}));
  EXPECT_FALSE(w->watched(0));
  EXPECT_FALSE(w->watched(1));
  EXPECT_TRUE(absl::StrContains(w->why(0), "share netdev eth0")) << w->why(0);
  EXPECT_TRUE(w->watched(2)) << w->why(2);
  // Whatever the shared counter does, those two are never busy.
  sys.Netdev("eth0", 1ull << 40, 1ull << 40);
  const absl::Duration t0 = absl::ZeroDuration();
  OwnBytes own[3];
  w->Sample(t0, Steady(own));
  sys.Netdev("eth0", 1ull << 41, 1ull << 41);
  w->Sample(t0 + absl::Milliseconds(10), Steady(own));
  EXPECT_EQ(w->busy_mask(kTx) & 3u, 0u);
  EXPECT_EQ(w->foreign_bytes(0, kTx), 0u);
}

TEST(ForeignWatch, MissingCountersAndAddressesSayWhy) {
  FakeSysfs sys;  // no statistics files for eth0 at all
  auto w = ForeignWatch::Create(
      TwoNics(), Options(sys),
      Interfaces({{"eth0", "10.0.0.1", false}}));  // 10.0.1.1 on no interface
  EXPECT_FALSE(w->watched(0));
  EXPECT_TRUE(absl::StrContains(w->why(0), "has no byte counters")) << w->why(0);
  EXPECT_FALSE(w->watched(1));
  EXPECT_TRUE(absl::StrContains(w->why(1), "no interface")) << w->why(1);
  // A failing interface list: every NIC off, with the list's error.
  auto failing = ForeignWatch::Create(TwoNics(), Options(sys), [] {
    return absl::StatusOr<std::vector<InterfaceAddress>>(
        absl::UnavailableError("getifaddrs: boom"));
  });
  EXPECT_TRUE(absl::StrContains(failing->why(1), "boom")) << failing->why(1);
  // No line rate and no threshold given: off, not a guess.
  sys.Netdev("eth0", 0, 0);
  auto no_rate = ForeignWatch::Create({{"rail0", "10.0.0.1", 0}}, Options(sys),
                                      Interfaces({{"eth0", "10.0.0.1", false}}));
  EXPECT_FALSE(no_rate->watched(0));
  EXPECT_TRUE(absl::StrContains(no_rate->why(0), "line rate")) << no_rate->why(0);
  // A threshold of 0 turns it off without looking at interfaces.
  ForeignOptions off = Options(sys);
  off.busy_bytes_per_s = 0;
  auto disabled = ForeignWatch::Create(TwoNics(), off, [] {
    ADD_FAILURE() << "listed interfaces while off";
    return absl::StatusOr<std::vector<InterfaceAddress>>(std::vector<InterfaceAddress>{});
  });
  EXPECT_FALSE(disabled->watched(0));
}

// Two NICs on their own netdevs; 125 MB/s each, so busy at 6.25 MB/s by default.
class WatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sys_.Netdev("eth0", 5000, 7000);
    sys_.Netdev("eth1", 0, 0);
    watch_ = ForeignWatch::Create(TwoNics(), Options(sys_),
                                  Interfaces({{"lo", "127.0.0.1", true},
                                              {"eth0", "10.0.0.1", false},
                                              {"eth1", "10.0.1.1", false}}));
    ASSERT_TRUE(watch_->watched(0)) << watch_->why(0);
    ASSERT_TRUE(watch_->watched(1)) << watch_->why(1);
    EXPECT_TRUE(absl::StrContains(watch_->why(0), "busy at 6250000 B/s"))
        << watch_->why(0);
    now_ = absl::ZeroDuration();
    Look();
  }
  // Moves `netdev`'s counters on by these bytes, then looks 10 ms later.
  void Step(uint64_t tx0, uint64_t tx1, uint64_t rx1 = 0) {
    k0_tx_ += tx0;
    k1_tx_ += tx1;
    k1_rx_ += rx1;
    sys_.Netdev("eth0", 5000 + k0_tx_, 7000);
    sys_.Netdev("eth1", k1_tx_, k1_rx_);
    now_ += absl::Milliseconds(10);
    Look();
  }
  void Look() { watch_->Sample(now_, Steady(own_)); }

  FakeSysfs sys_;
  std::unique_ptr<ForeignWatch> watch_;
  absl::Duration now_;
  OwnBytes own_[2];
  uint64_t k0_tx_ = 0, k1_tx_ = 0, k1_rx_ = 0;
};

TEST_F(WatchTest, ForeignAboveTheThresholdIsBusyBelowItIsNot) {
  // 100 kB per 10 ms = 10 MB/s of foreign traffic on eth1's tx: busy; eth0 idle.
  for (int i = 0; i < 6; ++i) Step(0, 100'000);
  EXPECT_EQ(watch_->busy_mask(kTx), 1u << 1);
  EXPECT_EQ(watch_->busy_mask(kRx), 0u);
  EXPECT_EQ(watch_->foreign_bytes(1, kTx), 600'000u);
  // 20 kB per 10 ms = 2 MB/s, under half the threshold, for longer than the hold.
  for (int i = 0; i < 20; ++i) Step(0, 20'000);
  EXPECT_EQ(watch_->busy_mask(kTx), 0u);
  // Below the threshold from the start: never busy.
  for (int i = 0; i < 20; ++i) Step(50'000, 0);  // 5 MB/s on eth0
  EXPECT_EQ(watch_->busy_mask(kTx), 0u);
  EXPECT_EQ(watch_->foreign_bytes(0, kTx), 1'000'000u);
}

TEST_F(WatchTest, OwnTrafficAtLineRateIsNotForeign) {
  // Our 1.25 MB per 10 ms (the whole line) on eth1, counted by us one look late; the
  // bytes the kernel has and we have not are in flight (the slack).
  for (int i = 0; i < 30; ++i) {
    own_[1].tx_slack = 1'250'000;
    Step(0, 1'250'000);
    own_[1].tx += 1'250'000;  // acknowledged by the next look
  }
  EXPECT_EQ(watch_->busy_mask(kTx), 0u);
  EXPECT_EQ(watch_->foreign_bytes(1, kTx), 0u);
  // The same with foreign traffic beside it: seen, once it is past the slack (our
  // chunk in flight at both snapshots of a look counts twice there: Bracket).
  for (int i = 0; i < 12; ++i) {
    Step(0, 1'250'000 + 200'000);
    own_[1].tx += 1'250'000;
  }
  EXPECT_EQ(watch_->busy_mask(kTx), 1u << 1);
}

TEST_F(WatchTest, TheOverheadAllowanceCoversOurHeaders) {
  ForeignOptions o = Options(sys_);
  o.header_overhead_fraction = 0.05;
  watch_ = ForeignWatch::Create(
      TwoNics(), o,
      Interfaces({{"eth0", "10.0.0.1", false}, {"eth1", "10.0.1.1", false}}));
  Look();
  // 1 MB of ours per look, and 4% more in headers on the wire: within the allowance.
  for (int i = 0; i < 20; ++i) {
    own_[1].tx += 1'000'000;
    Step(0, 1'040'000);
  }
  EXPECT_EQ(watch_->foreign_bytes(1, kTx), 0u);
  EXPECT_EQ(watch_->busy_mask(kTx), 0u);
}

TEST_F(WatchTest, ReceivedForeignTrafficMarksTheReceiveMask) {
  for (int i = 0; i < 6; ++i) Step(0, 0, 100'000);
  EXPECT_EQ(watch_->busy_mask(kRx), 1u << 1);
  EXPECT_EQ(watch_->busy_mask(kTx), 0u);
}

TEST_F(WatchTest, AResetCounterCountsNothingAndAnUnreadableOneKeepsTheState) {
  for (int i = 0; i < 6; ++i) Step(0, 100'000);
  ASSERT_EQ(watch_->busy_mask(kTx), 1u << 1);
  const uint64_t before = watch_->foreign_bytes(1, kTx);
  sys_.Netdev("eth1", 10, 0);  // the netdev was re-created
  now_ += absl::Milliseconds(10);
  Look();
  EXPECT_EQ(watch_->foreign_bytes(1, kTx), before);
  // A counter that cannot be read: the look is counted as an error, the state stays.
  sys_.Write("class/net/eth1/statistics/tx_bytes", "gone\n");
  now_ += absl::Milliseconds(10);
  Look();
  EXPECT_EQ(watch_->read_errors(1), 1u);
  EXPECT_EQ(watch_->read_errors(0), 0u);
  EXPECT_EQ(watch_->busy_mask(kTx), 1u << 1);
}

TEST_F(WatchTest, CountersUnreadableForTheHoldEndTheBusyState) {
  for (int i = 0; i < 6; ++i) Step(0, 100'000, 100'000);
  ASSERT_EQ(watch_->busy_mask(kTx), 1u << 1);
  ASSERT_EQ(watch_->busy_mask(kRx), 1u << 1);
  sys_.Write("class/net/eth1/statistics/tx_bytes", "gone\n");
  // Failing looks shorter than the hold (100 ms) keep the state ...
  for (int i = 0; i < 10; ++i) {
    now_ += absl::Milliseconds(10);
    Look();
  }
  EXPECT_EQ(watch_->busy_mask(kTx), 1u << 1);
  // ... the hold of them does not: busy no more, both ways.
  now_ += absl::Milliseconds(10);
  Look();
  EXPECT_EQ(watch_->read_errors(1), 11u);
  EXPECT_EQ(watch_->busy_mask(kTx), 0u);
  EXPECT_EQ(watch_->busy_mask(kRx), 0u);
  // Back: judged afresh, and busy again once foreign traffic is there again.
  for (int i = 0; i < 6; ++i) Step(0, 100'000);
  EXPECT_EQ(watch_->busy_mask(kTx), 1u << 1);
}

TEST_F(WatchTest, AChunkSentBetweenTheReadsIsNotForeign) {
  // Each look: a chunk starts after the first snapshot, the kernel counts it, and it
  // is acknowledged before the second. Taken from the first snapshot alone, its
  // bytes would be nobody's: 1 MB per 10 ms, foreign and busy.
  uint64_t own_tx = 0;
  for (int i = 0; i < 20; ++i) {
    int call = 0;
    now_ += absl::Milliseconds(10);
    watch_->Sample(now_, [&](std::span<OwnBytes> out) {
      if (call++ == 0) {
        out[1] = OwnBytes{.tx = own_tx};  // nothing in flight yet
        k1_tx_ += 1'000'000;
        sys_.Netdev("eth1", k1_tx_, k1_rx_);  // on the wire before the kernel read
      } else {
        own_tx += 1'000'000;  // acknowledged after it
        out[1] = OwnBytes{.tx = own_tx};
      }
    });
  }
  EXPECT_EQ(watch_->foreign_bytes(1, kTx), 0u);
  EXPECT_EQ(watch_->busy_mask(kTx), 0u);
}

TEST_F(WatchTest, ForeignTrafficInIsSeenWhileWeSendAtLineRate) {
  ForeignOptions o = Options(sys_);
  o.header_overhead_fraction = 0.05;
  o.ack_overhead_fraction = 0.025;
  watch_ = ForeignWatch::Create(
      TwoNics(), o,
      Interfaces({{"eth0", "10.0.0.1", false}, {"eth1", "10.0.1.1", false}}));
  Look();
  // We send 1.25 MB per 10 ms (line rate) on eth1, with the headers and the ACKs
  // coming back that the allowances expect; foreign bytes come in at the threshold
  // (62.5 kB per 10 ms, 6.25 MB/s; 1% over it, clear of rounding). One fraction for
  // both ways (5% of all our bytes, also on the receive side) would excuse 62.5 kB
  // a look coming in: nearly every foreign byte.
  for (int i = 0; i < 10; ++i) {
    own_[1].tx += 1'250'000;
    Step(0, 1'250'000 + 62'500, 31'250 + 63'125);
  }
  EXPECT_EQ(watch_->foreign_bytes(1, kTx), 0u);
  EXPECT_EQ(watch_->foreign_bytes(1, kRx), 10 * 63'125u);
  EXPECT_EQ(watch_->busy_mask(kRx), 1u << 1);
  EXPECT_EQ(watch_->busy_mask(kTx), 0u);
}

TEST(ForeignWatch, RdmaPortCountersCountFourByteWords) {
  FakeSysfs sys;
  sys.Netdev("ens1", 0, 0);
  sys.Write("class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0", "ens2\n");
  sys.Write("class/infiniband/mlx5_1/ports/1/gid_attrs/ndevs/0", "ens1\n");
  sys.Write("class/infiniband/mlx5_1/ports/1/gid_attrs/ndevs/1", "ens1\n");
  sys.Write("class/infiniband/mlx5_1/ports/1/counters/port_xmit_data", "100\n");
  sys.Write("class/infiniband/mlx5_1/ports/1/counters/port_rcv_data", "0\n");
  ForeignOptions o = Options(sys);
  o.rdma = true;
  auto w = ForeignWatch::Create({{"nic0", "10.0.0.1", 125'000'000}}, o,
                                Interfaces({{"ens1", "10.0.0.1", false}}));
  ASSERT_TRUE(w->watched(0)) << w->why(0);
  EXPECT_TRUE(absl::StrContains(w->why(0), "RDMA mlx5_1 port 1")) << w->why(0);
  OwnBytes own[1];
  const absl::Duration t0 = absl::ZeroDuration();
  w->Sample(t0, Steady(own));
  sys.Write("class/infiniband/mlx5_1/ports/1/counters/port_xmit_data", "350\n");
  w->Sample(t0 + absl::Milliseconds(10), Steady(own));
  EXPECT_EQ(w->foreign_bytes(0, kTx), 1000u);  // 250 words
  // A netdev that no RDMA port names: off, saying so, though the netdev has
  // counters: RDMA traffic may go past them (ConnectX's does).
  sys.Netdev("ens3", 0, 0);
  auto none = ForeignWatch::Create({{"nic0", "10.0.0.3", 125'000'000}}, o,
                                   Interfaces({{"ens3", "10.0.0.3", false}}));
  EXPECT_FALSE(none->watched(0));
  EXPECT_TRUE(absl::StrContains(none->why(0), "no RDMA port")) << none->why(0);
  // Two netdevs of one RDMA port (its GIDs name both): one counter, not watched.
  sys.Netdev("ens4", 0, 0);
  sys.Netdev("ens4v", 0, 0);
  sys.Write("class/infiniband/mlx5_4/ports/1/gid_attrs/ndevs/0", "ens4\n");
  sys.Write("class/infiniband/mlx5_4/ports/1/gid_attrs/ndevs/1", "ens4v\n");
  sys.Write("class/infiniband/mlx5_4/ports/1/counters/port_xmit_data", "0\n");
  sys.Write("class/infiniband/mlx5_4/ports/1/counters/port_rcv_data", "0\n");
  auto shared = ForeignWatch::Create(
      {{"nic0", "10.0.4.1", 125'000'000}, {"nic1", "10.0.4.2", 125'000'000}}, o,
      Interfaces({{"ens4", "10.0.4.1", false}, {"ens4v", "10.0.4.2", false}}));
  EXPECT_FALSE(shared->watched(0));
  EXPECT_FALSE(shared->watched(1));
  EXPECT_TRUE(absl::StrContains(shared->why(1), "share RDMA mlx5_4 port 1"))
      << shared->why(1);
  // A port without data counters (Soft-RoCE): its netdev's counters, saying why.
  sys.Write("class/infiniband/rxe0/ports/1/gid_attrs/ndevs/0", "veth0\n");
  sys.Write("class/infiniband/rxe0/ports/1/hw_counters/sent_pkts", "0\n");
  sys.Netdev("veth0", 0, 0);
  auto rxe = ForeignWatch::Create({{"nic0", "10.0.0.4", 125'000'000}}, o,
                                  Interfaces({{"veth0", "10.0.0.4", false}}));
  ASSERT_TRUE(rxe->watched(0)) << rxe->why(0);
  EXPECT_TRUE(
      absl::StrContains(rxe->why(0), "netdev veth0 (RDMA rxe0 port 1 has no data"))
      << rxe->why(0);
}

}  // namespace
}  // namespace fuselink::nicstat
