// The verbs fabric on real RDMA devices: two fabrics in one process, "a" on the A ends
// of the rails and "b" on the B ends. FUSELINK_RDMA_RAILS="a0,b0;a1,b1" names each
// rail's two IPv4 addresses, FUSELINK_RDMA_VETHS="vA0,vB0;..." their interfaces
// (scripts/rdma-vm.sh sets both inside its Soft-RoCE VM). Skips, saying why, elsewhere;
// the binary then exits 77 (ctest: skipped), see main() below.
//
// Every write goes through a window b opened for a (Fabric::OpenWindow); the refusal
// tests compare every byte of b's memory with what it should hold.
#include "agent/fabric/verbs_fabric.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/handshake.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/verbs_device.h"
#include "agent/fabric/verbs_wire.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"
#include "tests/rdma/rails.h"

namespace fuselink::fabric {
namespace {

using testing::ManyBytes;
using testing::RecordingHandler;
using Clock = std::chrono::steady_clock;

constexpr uint8_t kUntouched = 0xAB;

using testing::Rail;

std::vector<Rail> Rails() { return testing::RailsFrom("FUSELINK_RDMA_RAILS"); }

// Why the hardware tests cannot run here, or empty.
std::string SkipReason() {
  struct stat info;
  if (stat("/sys/class/infiniband", &info) != 0) {
    return "no RDMA device: /sys/class/infiniband is absent (run scripts/rdma-vm.sh)";
  }
  if (Rails().empty()) {
    return "FUSELINK_RDMA_RAILS is not set (scripts/rdma-vm.sh sets it in its VM)";
  }
  return "";
}

std::vector<uint8_t> RandomBytes(size_t bytes, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<uint8_t> out(bytes);
  for (uint8_t& byte : out) byte = static_cast<uint8_t>(random());
  return out;
}

VerbsFabricOptions Options(std::string name, bool a_side, int nic_count, int qps,
                           testing::KeyRing& ring) {
  VerbsFabricOptions options;
  options.keys = ring.For(name);
  options.node_name = std::move(name);
  std::vector<Rail> rails = Rails();
  for (int nic = 0; nic < nic_count; ++nic) {
    options.nics.push_back({.nic = nic, .address = a_side ? rails[nic].a : rails[nic].b});
  }
  options.qps_per_peer_nic = qps;
  options.rc.timeout = 14;   // ~67 ms per try
  options.rc.retry_cnt = 3;  // a dead path fails in well under a second
  return options;
}

// Also keeps each arrival's peer name (Arrival::peer_name is valid during the call).
// A check, when set, sees each arrival first.
class NamingHandler : public testing::RecordingHandler {
 public:
  void OnArrival(const Arrival& arrival) override {
    {
      absl::MutexLock lock(&mu_);
      if (check_) check_(arrival);
      names_.emplace_back(arrival.peer_name);
    }
    RecordingHandler::OnArrival(arrival);
  }
  void SetCheck(std::function<void(const Arrival&)> check) {
    absl::MutexLock lock(&mu_);
    check_ = std::move(check);
  }
  std::vector<std::string> names() const {
    absl::MutexLock lock(&mu_);
    return names_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);
  std::function<void(const Arrival&)> check_ ABSL_GUARDED_BY(mu_);
};

// Counts how often a CloseWindow's `drained` ran.
class DrainCounter {
 public:
  absl::AnyInvocable<void() &&> Callback() {
    return [this] {
      absl::MutexLock lock(&mu_);
      ++runs_;
    };
  }
  // Waits (kWaitTimeout) until it ran at least `count` times; the number of runs.
  int WaitFor(int count) {
    absl::MutexLock lock(&mu_);
    struct Args {
      const int* runs;
      int count;
    } args{&runs_, count};
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](Args* a) { return *a->runs >= a->count; }, &args),
                         testing::kWaitTimeout);
    return runs_;
  }

 private:
  absl::Mutex mu_;
  int runs_ ABSL_GUARDED_BY(mu_) = 0;
};

// Make(...), and out of the test when it skipped or failed.
#define FL_MAKE(...)                              \
  do {                                            \
    Make(__VA_ARGS__);                            \
    if (HasFatalFailure() || IsSkipped()) return; \
  } while (0)

// Create(...) without the connect, and out of the test when it skipped or failed.
#define FL_MAKE_UNCONNECTED(...)                  \
  do {                                            \
    Create(__VA_ARGS__);                          \
    if (HasFatalFailure() || IsSkipped()) return; \
  } while (0)

class VerbsFabricTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = SkipReason(); !why.empty()) GTEST_SKIP() << why;
  }
  // Creates a and b over `nic_count` rails; `tune_b` and `tune_a` adjust their options.
  void Create(int nic_count, int qps,
              const std::function<void(VerbsFabricOptions&)>& tune_b = nullptr,
              const std::function<void(VerbsFabricOptions&)>& tune_a = nullptr) {
    if (static_cast<int>(Rails().size()) < nic_count) {
      GTEST_SKIP() << "needs " << nic_count << " rails in FUSELINK_RDMA_RAILS";
    }
    VerbsFabricOptions a_options = Options("a", true, nic_count, qps, keys_);
    if (tune_a) tune_a(a_options);
    auto a = CreateVerbsFabric(a_options, &a_events_);
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = *std::move(a);
    VerbsFabricOptions b_options = Options("b", false, nic_count, qps, keys_);
    if (tune_b) tune_b(b_options);
    auto b = CreateVerbsFabric(b_options, &b_events_);
    ASSERT_TRUE(b.ok()) << b.status();
    b_ = *std::move(b);
  }
  // Connects a to b.
  void ConnectAB() {
    const auto started = Clock::now();
    absl::StatusOr<PeerId> peer = a_->Connect("b", b_->endpoints());
    connect_seconds_ = std::chrono::duration<double>(Clock::now() - started).count();
    ASSERT_TRUE(peer.ok()) << peer.status();
    b_on_a_ = *peer;
    std::printf("bench: connect %d NICs x QPs: %.1f ms\n", a_->nic_count(),
                connect_seconds_ * 1e3);
  }
  void Make(int nic_count, int qps,
            const std::function<void(VerbsFabricOptions&)>& tune_b = nullptr,
            const std::function<void(VerbsFabricOptions&)>& tune_a = nullptr) {
    Create(nic_count, qps, tune_b, tune_a);
    if (HasFatalFailure() || IsSkipped()) return;
    ConnectAB();
  }
  RegionKey Region(Fabric& fabric, std::vector<uint8_t>& memory) {
    absl::StatusOr<RegionKey> key =
        fabric.RegisterRegion(memory.data(), memory.size(), nullptr);
    EXPECT_TRUE(key.ok()) << key.status();
    return key.value_or(0);
  }
  // A window of b's region for `peer`.
  WindowKey Window(RegionKey region, absl::string_view peer,
                   std::vector<Extent> extents) {
    absl::StatusOr<WindowKey> key = b_->OpenWindow(region, peer, extents);
    EXPECT_TRUE(key.ok()) << key.status();
    return key.value_or(0);
  }
  // Posts on a, waiting out RESOURCE_EXHAUSTED (back-pressure).
  absl::Status Post(int nic, const WriteOp& op) {
    while (true) {
      absl::Status posted = a_->PostWrite(b_on_a_, nic, op);
      if (posted.code() != absl::StatusCode::kResourceExhausted) return posted;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // a's completion of `wr_id`, waiting for it; fails the test if it came twice.
  std::optional<Completion> CompletionOf(uint64_t wr_id) {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      std::optional<Completion> found;
      int count = 0;
      for (const Completion& c : a_events_.completions()) {
        if (c.wr_id == wr_id) {
          found = c;
          ++count;
        }
      }
      EXPECT_LE(count, 1) << "wr_id " << wr_id << " completed " << count << " times";
      if (found.has_value()) return found;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ADD_FAILURE() << "no completion for wr_id " << wr_id;
    return std::nullopt;
  }

  testing::KeyRing keys_;  // outlives the fabrics
  testing::RecordingHandler a_events_;
  NamingHandler b_events_;
  std::unique_ptr<Fabric> a_;
  std::unique_ptr<Fabric> b_;
  PeerId b_on_a_ = 0;
  double connect_seconds_ = 0;
};

TEST_F(VerbsFabricTest, DiscoveryPicksTheRoceV2GidOfEachAddress) {
  for (const Rail& rail : Rails()) {
    for (const std::string& address : {rail.a, rail.b}) {
      absl::StatusOr<verbs::NicBinding> binding = verbs::BindAddress(address);
      ASSERT_TRUE(binding.ok()) << binding.status();
      const std::string base = absl::StrCat(
          "/sys/class/infiniband/", binding->port.device, "/ports/", binding->port.port);
      std::string gid, type;
      std::getline(std::ifstream(absl::StrCat(base, "/gids/", binding->gid_index)), gid);
      std::getline(
          std::ifstream(absl::StrCat(base, "/gid_attrs/types/", binding->gid_index)),
          type);
      EXPECT_EQ(verbs::GidToString(binding->gid), absl::StrCat("::ffff:", address));
      EXPECT_NE(gid.find("ffff"), std::string::npos) << gid;
      EXPECT_EQ(type, "RoCE v2");
      std::printf(
          "discovery: %s -> %s port %d GID index %u (%s, %s) netdev %s mtu %d "
          "max_qp_wr %d max_cqe %d max_sge %d max_mr_size %llu pci '%s'\n",
          address.c_str(), binding->port.device.c_str(), binding->port.port,
          binding->gid_index, gid.c_str(), type.c_str(), binding->port.netdev.c_str(),
          128 << binding->port.active_mtu, binding->port.max_qp_wr, binding->port.max_cqe,
          binding->port.max_sge,
          static_cast<unsigned long long>(binding->port.max_mr_size),
          binding->port.pci_path.c_str());
      if (!rail.a_veth.empty()) {
        EXPECT_EQ(binding->port.netdev, address == rail.a ? rail.a_veth : rail.b_veth);
      }
    }
  }
  std::vector<std::string> all;
  for (const Rail& rail : Rails()) all.push_back(rail.a);
  EXPECT_TRUE(verbs::VerbsAvailable(all));
  all.push_back("192.0.2.1");  // TEST-NET: on no device
  EXPECT_FALSE(verbs::VerbsAvailable(all));
  EXPECT_EQ(verbs::BindAddress("192.0.2.1").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(VerbsFabricTest, SetsUpAndTearsDownQps) {
  FL_MAKE(2, 4);
  EXPECT_EQ(a_->transport(), "verbs");
  EXPECT_EQ(a_->PeerName(b_on_a_), "b");
  // Connecting again returns the same peer.
  absl::StatusOr<PeerId> again = a_->Connect("b", b_->endpoints());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, b_on_a_);
  a_.reset();  // every QP to ERR, drained, destroyed
  ASSERT_TRUE(a_events_.WaitForPeersLost(1));
  EXPECT_EQ(a_events_.peers_lost()[0].second.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(b_events_.WaitForPeersLost(1));
  EXPECT_EQ(b_events_.peers_lost()[0].second.code(), absl::StatusCode::kUnavailable);
  b_.reset();
}

class VerbsWriteTest : public VerbsFabricTest,
                       public ::testing::WithParamInterface<std::pair<int, int>> {};

TEST_P(VerbsWriteTest, RandomWritesLandExactly) {
  const auto [nic_count, qps] = GetParam();
  FL_MAKE(nic_count, qps);
  constexpr size_t kBytes = 4 << 20;
  constexpr uint64_t kHole = 1 << 20;
  std::vector<uint8_t> source = RandomBytes(kBytes, 7);
  std::vector<uint8_t> target(kBytes + 8192, kUntouched);
  const RegionKey source_key = Region(*a_, source);
  // The region is the middle of `target`: 4 KiB either side must stay untouched.
  absl::StatusOr<RegionKey> target_key =
      b_->RegisterRegion(target.data() + 4096, kBytes, nullptr);
  ASSERT_TRUE(target_key.ok()) << target_key.status();
  // The window: the region but a hole at [1 MiB, 1 MiB + 100), which no write names.
  const WindowKey window =
      Window(*target_key, "a", {{0, kHole}, {kHole + 100, kBytes - kHole - 100}});
  ASSERT_NE(window, 0u);
  std::mt19937 random(11);
  std::vector<WriteOp> ops;
  for (uint64_t offset = 0; offset < kBytes;) {
    uint32_t bytes = std::min<uint64_t>(1 + random() % (256 << 10), kBytes - offset);
    if (offset < kHole && offset + bytes > kHole) bytes = kHole - offset;
    if (offset == kHole) {
      offset += 100;
      continue;
    }
    ops.push_back({.local_key = source_key,
                   .local_offset = offset,
                   .remote_key = window,
                   .remote_offset = offset,
                   .bytes = bytes,
                   .imm = static_cast<uint32_t>(ops.size()),
                   .wr_id = ops.size()});
    offset += bytes;
  }
  ops.push_back({.imm = 0xC0FFEE, .wr_id = ops.size()});  // a notification
  for (size_t i = 0; i < ops.size(); ++i) {
    absl::Status posted = Post(static_cast<int>(i % nic_count), ops[i]);
    ASSERT_TRUE(posted.ok()) << posted;
  }
  ASSERT_TRUE(a_events_.WaitForCompletions(ops.size()));
  ASSERT_TRUE(b_events_.WaitForArrivals(ops.size()));
  std::map<uint64_t, int> seen;
  for (const Completion& c : a_events_.completions()) {
    EXPECT_TRUE(c.status.ok()) << c.status;
    ++seen[c.wr_id];
  }
  EXPECT_EQ(seen.size(), ops.size());
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << "wr_id " << id;
  bool notified = false;
  for (const Arrival& arrival : b_events_.arrivals()) {
    EXPECT_NE(arrival.peer, 0u);
    if (arrival.bytes == 0) {
      notified = arrival.imm == 0xC0FFEE;
      EXPECT_EQ(arrival.window, 0u);
      continue;
    }
    EXPECT_EQ(arrival.window, window);
    EXPECT_EQ(ops[arrival.imm].remote_offset, arrival.offset);
  }
  for (const std::string& name : b_events_.names()) EXPECT_EQ(name, "a");
  EXPECT_TRUE(notified);
  for (size_t i = 0; i < 4096; ++i) {
    ASSERT_EQ(target[i], kUntouched) << "before the region, byte " << i;
    ASSERT_EQ(target[4096 + kBytes + i], kUntouched) << "after the region, byte " << i;
  }
  for (size_t i = 0; i < kBytes; ++i) {
    const bool hole = i >= kHole && i < kHole + 100;
    ASSERT_EQ(target[4096 + i], hole ? kUntouched : source[i]) << "byte " << i;
  }
  uint64_t sent = 0, received = 0;
  for (int nic = 0; nic < nic_count; ++nic) {
    sent += a_->counters(nic).transmitted_bytes;
    received += b_->counters(nic).received_bytes;
  }
  EXPECT_EQ(sent, kBytes - 100);
  EXPECT_EQ(received, kBytes - 100);
  DrainCounter drained;
  b_->CloseWindow(window, drained.Callback());
  EXPECT_EQ(drained.WaitFor(1), 1);
}

INSTANTIATE_TEST_SUITE_P(Rails, VerbsWriteTest,
                         ::testing::Values(std::pair{1, 2}, std::pair{2, 3}));

// Checks a refused write's completion: the code, the reason, the refusal.
void ExpectRefused(const std::optional<Completion>& c, Refusal refusal,
                   absl::string_view what) {
  ASSERT_TRUE(c.has_value()) << what;
  const absl::Status expected = RefusalStatus(refusal);
  EXPECT_EQ(c->refusal, refusal) << what << ": " << c->status;
  EXPECT_EQ(c->status.code(), expected.code()) << what << ": " << c->status;
  EXPECT_EQ(ReasonOf(c->status), ReasonOf(expected)) << what << ": " << c->status;
  std::printf("refusal: %s -> %s\n", std::string(what).c_str(),
              c->status.ToString().c_str());
}

// b's memory: 4 windows' worth of 64 KiB blocks. W1 is a's: blocks 0 and 2; W2 is
// another peer's ("c"): block 1; W3, a's, opened after W1 closes: block 3.
TEST_F(VerbsFabricTest, RefusalsPlaceNothingAndTheFabricGoesOn) {
  FL_MAKE(2, 2);
  constexpr uint64_t kBlock = 64 << 10;
  std::vector<uint8_t> source = RandomBytes(kBlock, 3);
  std::vector<uint8_t> target(4 * kBlock, kUntouched);
  std::vector<uint8_t> expected = target;  // what b's memory must hold
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  const WindowKey w1 = Window(target_key, "a", {{0, kBlock}, {2 * kBlock, kBlock}});
  const WindowKey w2 = Window(target_key, "c", {{kBlock, kBlock}});
  ASSERT_NE(w1, 0u);
  ASSERT_NE(w2, 0u);
  uint64_t wr_id = 1;
  auto write = [&](int nic, WindowKey key, uint64_t offset, uint32_t bytes) {
    const uint64_t id = wr_id++;
    absl::Status posted = Post(nic, {.local_key = source_key,
                                     .remote_key = key,
                                     .remote_offset = offset,
                                     .bytes = bytes,
                                     .imm = static_cast<uint32_t>(id),
                                     .wr_id = id});
    EXPECT_TRUE(posted.ok()) << posted;
    return CompletionOf(id);
  };
  auto lands = [&](int nic, WindowKey key, uint64_t offset, uint32_t bytes) {
    std::optional<Completion> c = write(nic, key, offset, bytes);
    ASSERT_TRUE(c.has_value());
    EXPECT_TRUE(c->status.ok()) << c->status;
    EXPECT_EQ(c->refusal, Refusal::kNone);
    std::copy(source.begin(), source.begin() + bytes, expected.begin() + offset);
  };
  auto unchanged = [&](absl::string_view after) {
    for (size_t i = 0; i < target.size(); ++i) {
      ASSERT_EQ(target[i], expected[i]) << "byte " << i << " after " << after;
    }
  };

  // Inside W1, on both NICs (each write goes to the next QP of its NIC).
  for (int i = 0; i < 4; ++i) lands(i % 2, w1, (i < 2 ? 0 : 2 * kBlock) + i * 4096, 4096);
  unchanged("writes inside W1");
  // Outside W1's extents: in the gap (W2's block), and across the end of extent 0.
  ExpectRefused(write(0, w1, kBlock, 4096), Refusal::kOutsideWindow, "W1, in its gap");
  ExpectRefused(write(1, w1, kBlock - 2048, 4096), Refusal::kOutsideWindow,
                "W1, across an extent's end");
  ExpectRefused(write(0, w1, 4 * kBlock, 16), Refusal::kOutsideWindow,
                "W1, past the region");
  unchanged("writes outside W1");
  // Into another peer's window.
  ExpectRefused(write(0, w2, kBlock, 4096), Refusal::kNotYourWindow, "c's W2");
  unchanged("a write into c's window");
  // A key b never handed out.
  WindowKey stale = w1 ^ 0x5A5A5A5Au;
  if (stale == w2 || stale == 0) stale ^= 1;
  ExpectRefused(write(1, stale, 0, 4096), Refusal::kNoWindow, "a key never opened");
  unchanged("a write with a stale key");
  // W1 closes: drained runs once; a late write and its duplicate place nothing.
  DrainCounter drained;
  b_->CloseWindow(w1, drained.Callback());
  EXPECT_EQ(drained.WaitFor(1), 1);
  ExpectRefused(write(0, w1, 4096, 4096), Refusal::kNoWindow, "W1 after its close");
  ExpectRefused(write(0, w1, 4096, 4096), Refusal::kNoWindow, "the same write again");
  ExpectRefused(write(1, w1, 2 * kBlock, 4096), Refusal::kNoWindow,
                "W1 after its close, NIC 1");
  unchanged("late writes into W1");
  // The fabric goes on: W3 takes writes on both NICs and every QP.
  const WindowKey w3 = Window(target_key, "a", {{3 * kBlock, kBlock}});
  for (int i = 0; i < 8; ++i) lands(i % 2, w3, 3 * kBlock + i * 4096, 4096);
  unchanged("writes inside W3");
  b_->CloseWindow(w3, drained.Callback());
  b_->CloseWindow(w2, drained.Callback());
  EXPECT_EQ(drained.WaitFor(3), 3);
  b_->CloseWindow(w3, drained.Callback());  // unknown by now: drained at once
  EXPECT_EQ(drained.WaitFor(4), 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(drained.WaitFor(4), 4) << "a drained ran twice";
  // Only the 12 writes that landed arrived, each from "a".
  EXPECT_EQ(b_events_.arrivals().size(), 12u);
  for (const std::string& name : b_events_.names()) EXPECT_EQ(name, "a");
  uint64_t refused = 0;
  for (int nic = 0; nic < 2; ++nic) refused += b_->counters(nic).refused_writes;
  std::printf("refusal: b counted %llu refused writes\n",
              static_cast<unsigned long long>(refused));
  EXPECT_GE(refused, 5u);  // the 5 queried before the close, at least
  EXPECT_TRUE(a_events_.peers_lost().empty());
}

// A late write that the source still has the rkey for: b does not tell a of closes,
// so the write meets b's NIC. It completes NOT_FOUND WINDOW_CLOSED; the writes queued
// behind it on the same QP are posted again on the renewed QP and land.
class VerbsLateWriteTest : public VerbsFabricTest,
                           public ::testing::WithParamInterface<int> {};

TEST_P(VerbsLateWriteTest, MeetsTheNicAndTheQpIsRenewed) {
  const int qps = GetParam();
  FL_MAKE(1, qps, [](VerbsFabricOptions& b) { b.push_window_closes = false; });
  constexpr uint64_t kBlock = 256 << 10;
  std::vector<uint8_t> source = RandomBytes(kBlock, 9);
  std::vector<uint8_t> target(2 * kBlock, kUntouched);
  std::vector<uint8_t> expected = target;
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  for (int round = 0; round < 2; ++round) {
    const WindowKey old_window = Window(target_key, "a", {{0, kBlock}});
    const WindowKey window = Window(target_key, "a", {{kBlock, kBlock}});
    DrainCounter drained;
    b_->CloseWindow(old_window, drained.Callback());
    ASSERT_EQ(drained.WaitFor(1), 1);
    const uint64_t base = 1000 * (round + 1);
    // The late write, then 16 writes into the open window on the same NIC (with one
    // QP: on the same QP, right behind it; with two: half of them).
    ASSERT_TRUE(Post(0, {.local_key = source_key,
                         .remote_key = old_window,
                         .remote_offset = 0,
                         .bytes = 16 << 10,
                         .imm = 1,
                         .wr_id = base})
                    .ok());
    constexpr int kBehind = 16;
    for (int i = 0; i < kBehind; ++i) {
      const uint64_t offset = kBlock + i * (16 << 10);
      ASSERT_TRUE(Post(0, {.local_key = source_key,
                           .local_offset = uint64_t(i) * (16 << 10),
                           .remote_key = window,
                           .remote_offset = offset,
                           .bytes = 16 << 10,
                           .imm = 2,
                           .wr_id = base + 1 + i})
                      .ok());
      std::copy(source.begin() + i * (16 << 10), source.begin() + (i + 1) * (16 << 10),
                expected.begin() + offset);
    }
    const auto started = Clock::now();
    ExpectRefused(CompletionOf(base), Refusal::kNoWindow, "a write meeting b's NIC late");
    for (int i = 0; i < kBehind; ++i) {
      std::optional<Completion> c = CompletionOf(base + 1 + i);
      ASSERT_TRUE(c.has_value());
      EXPECT_TRUE(c->status.ok()) << "write " << i << " behind it: " << c->status;
    }
    std::printf(
        "bench: late write with %d QPs: refusal and %d writes behind it in %.1f ms\n",
        qps, kBehind,
        std::chrono::duration<double, std::milli>(Clock::now() - started).count());
    for (size_t i = 0; i < target.size(); ++i) {
      ASSERT_EQ(target[i], expected[i]) << "byte " << i << ", round " << round;
    }
    b_->CloseWindow(window, drained.Callback());
    ASSERT_EQ(drained.WaitFor(2), 2);
    std::fill(target.begin(), target.end(), kUntouched);
    expected = target;
  }
  // Two rounds: two refusals, both by b's NIC (a counted them from its CQ; b answered
  // no QUERY, which is how a source learns of a refusal it decided itself).
  EXPECT_EQ(a_->counters(0).refused_writes, 2u);
  EXPECT_EQ(b_->counters(0).refused_writes, 0u);
  // Every QP still carries writes.
  const WindowKey window = Window(target_key, "a", {{0, 2 * kBlock}});
  for (int i = 0; i < 2 * qps; ++i) {
    ASSERT_TRUE(Post(0, {.local_key = source_key,
                         .remote_key = window,
                         .remote_offset = uint64_t(i) * 4096,
                         .bytes = 4096,
                         .wr_id = 5000u + i})
                    .ok());
  }
  for (int i = 0; i < 2 * qps; ++i) {
    std::optional<Completion> c = CompletionOf(5000u + i);
    ASSERT_TRUE(c.has_value());
    EXPECT_TRUE(c->status.ok()) << c->status;
  }
  EXPECT_TRUE(a_events_.peers_lost().empty());
  EXPECT_TRUE(b_events_.peers_lost().empty());
}

INSTANTIATE_TEST_SUITE_P(Qps, VerbsLateWriteTest, ::testing::Values(1, 2));

// The target goes away while the source renews the QP a late write broke: every write
// still completes exactly once — the late one refused (or UNAVAILABLE if the QP died
// first), the ones held behind it OK or UNAVAILABLE, nothing else — and a loses b.
TEST_F(VerbsFabricTest, ARenewalCutOffByThePeersGoingFailsItsWritesOnce) {
  FL_MAKE(1, 1, [](VerbsFabricOptions& b) { b.push_window_closes = false; });
  constexpr uint32_t kWrite = 64 << 10;
  std::vector<uint8_t> source = RandomBytes(kWrite, 13);
  std::vector<uint8_t> target(2 * kWrite, kUntouched);
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  const WindowKey old_window = Window(target_key, "a", {{0, kWrite}});
  const WindowKey window = Window(target_key, "a", {{kWrite, kWrite}});
  DrainCounter drained;
  b_->CloseWindow(old_window, drained.Callback());
  ASSERT_EQ(drained.WaitFor(1), 1);
  constexpr int kBehind = 32;
  ASSERT_TRUE(Post(0, {.local_key = source_key,
                       .remote_key = old_window,
                       .bytes = kWrite,
                       .wr_id = 0})
                  .ok());
  for (int i = 1; i <= kBehind; ++i) {
    ASSERT_TRUE(Post(0, {.local_key = source_key,
                         .remote_key = window,
                         .remote_offset = kWrite,
                         .bytes = kWrite,
                         .wr_id = uint64_t(i)})
                    .ok());
  }
  b_.reset();  // while the refusal and the renewal are under way
  ASSERT_TRUE(a_events_.WaitForCompletions(kBehind + 1));
  ASSERT_TRUE(a_events_.WaitForPeersLost(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // no late duplicates
  std::map<uint64_t, int> seen;
  int ok = 0, unavailable = 0;
  for (const Completion& c : a_events_.completions()) {
    ++seen[c.wr_id];
    if (c.wr_id == 0) {
      EXPECT_TRUE(c.refusal == Refusal::kNoWindow ||
                  c.status.code() == absl::StatusCode::kUnavailable)
          << c.status;
      continue;
    }
    if (c.status.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(c.status.code(), absl::StatusCode::kUnavailable) << c.status;
      ++unavailable;
    }
  }
  EXPECT_EQ(seen.size(), size_t{kBehind + 1});
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << "wr_id " << id;
  std::printf("cut-off renewal: late write: %s; behind it %d OK, %d UNAVAILABLE\n",
              a_events_.completions().empty()
                  ? "-"
                  : [&] {
                      for (const Completion& c : a_events_.completions()) {
                        if (c.wr_id == 0) return c.status.ToString();
                      }
                      return std::string("?");
                    }()
                          .c_str(),
              ok, unavailable);
}

// A window closed while writes into it are on the wire: each completes OK (all of it
// landed) or NOT_FOUND WINDOW_CLOSED, never UNAVAILABLE; once `drained` has run,
// nothing in b's memory changes any more, and every OK write is in it.
TEST_F(VerbsFabricTest, NothingLandsOnceDrainedHasRun) {
  FL_MAKE(1, 2);
  constexpr uint32_t kWrite = 1 << 20;
  constexpr int kWrites = 48;  // 48 MiB: about a second on rxe under TCG
  std::vector<uint8_t> source = ManyBytes(size_t{kWrites} * kWrite, 12);
  std::vector<uint8_t> target(source.size(), kUntouched);
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  const WindowKey window = Window(target_key, "a", {{0, target.size()}});
  absl::Mutex mu;
  std::vector<uint8_t> at_drained;
  int drained_runs = 0;
  Clock::time_point drained_at;
  const auto started = Clock::now();
  for (int i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(Post(0, {.local_key = source_key,
                         .local_offset = uint64_t(i) * kWrite,
                         .remote_key = window,
                         .remote_offset = uint64_t(i) * kWrite,
                         .bytes = kWrite,
                         .wr_id = uint64_t(i)})
                    .ok());
  }
  // Once the first write has arrived: the others are on the wire or queued.
  ASSERT_TRUE(b_events_.WaitForArrivals(1));
  const auto closing = Clock::now();
  b_->CloseWindow(window, [&] {
    absl::MutexLock lock(&mu);
    at_drained = target;  // what b's memory holds once drained
    drained_at = Clock::now();
    ++drained_runs;
  });
  ASSERT_TRUE(a_events_.WaitForCompletions(kWrites));
  const auto completed = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int ok = 0, refused = 0;
  absl::MutexLock lock(&mu);
  ASSERT_EQ(drained_runs, 1);
  EXPECT_EQ(target, at_drained) << "bytes landed after drained ran";
  for (int i = 0; i < kWrites; ++i) {
    std::optional<Completion> c = CompletionOf(uint64_t(i));
    ASSERT_TRUE(c.has_value());
    if (c->status.ok()) {
      ++ok;
      EXPECT_TRUE(std::equal(source.begin() + size_t(i) * kWrite,
                             source.begin() + size_t(i + 1) * kWrite,
                             at_drained.begin() + size_t(i) * kWrite))
          << "write " << i << " completed OK but is not all there";
    } else {
      ++refused;
      EXPECT_EQ(c->refusal, Refusal::kNoWindow) << i << ": " << c->status;
    }
  }
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf(
      "drained: %d writes landed, %d refused by the close; close at %.1f ms, "
      "drained %.1f ms later, all complete at %.1f ms\n",
      ok, refused, ms(closing - started), ms(drained_at - closing),
      ms(completed - started));
  EXPECT_EQ(ok + refused, kWrites);
  EXPECT_GT(refused, 0) << "the close came after the last write: it proved nothing";
}

// A window opened before its peer connects reaches the peer in the handshake.
TEST_F(VerbsFabricTest, WindowOpenedBeforeTheConnectIsKnownAtOnce) {
  Create(2, 2);
  if (HasFatalFailure() || IsSkipped()) return;
  std::vector<uint8_t> source = RandomBytes(8192, 4);
  std::vector<uint8_t> target(8192, kUntouched);
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  const WindowKey window = Window(target_key, "a", {{0, 8192}});
  ConnectAB();
  if (HasFatalFailure()) return;
  for (int nic = 0; nic < 2; ++nic) {
    ASSERT_TRUE(Post(nic, {.local_key = source_key,
                           .local_offset = uint64_t(nic) * 4096,
                           .remote_key = window,
                           .remote_offset = uint64_t(nic) * 4096,
                           .bytes = 4096,
                           .wr_id = uint64_t(nic)})
                    .ok());
  }
  for (uint64_t id = 0; id < 2; ++id) {
    std::optional<Completion> c = CompletionOf(id);
    ASSERT_TRUE(c.has_value());
    EXPECT_TRUE(c->status.ok()) << c->status;
  }
  EXPECT_EQ(target, source);
}

// `rdma resource show TYPE` lines of this process; -1 when the tool cannot say.
int RdmaResources(absl::string_view type) {
  const std::string command = absl::StrCat("rdma resource show ", type, " 2>/dev/null");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  const std::string mine = absl::StrCat(" pid ", getpid(), " ");
  int count = 0;
  bool any = false;
  char line[1024];
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    any = true;
    if (std::string(line).find(mine) != std::string::npos) ++count;
  }
  if (pclose(pipe) != 0 || !any) return -1;
  return count;
}

TEST_F(VerbsFabricTest, ManyWindowsLeaveNoRegistrationsBehind) {
  constexpr uint32_t kBudget = 64;  // registrations per NIC
  FL_MAKE(2, 2,
          [&](VerbsFabricOptions& b) { b.max_window_registrations_per_nic = kBudget; });
  constexpr uint64_t kBlock = 4096;
  std::vector<uint8_t> source = RandomBytes(kBlock, 5);
  std::vector<uint8_t> target(64 * kBlock, kUntouched);
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  const int mrs_before = RdmaResources("mr");
  const int pds_before = RdmaResources("pd");
  std::printf("leaks: before: %d MRs, %d PDs of this process\n", mrs_before, pds_before);
  // Up to the budget: 16 windows of 4 extents each (every other block).
  std::vector<WindowKey> open;
  for (int w = 0; w < 16; ++w) {
    std::vector<Extent> extents;
    for (int e = 0; e < 4; ++e) extents.push_back({(w * 4 + e) * kBlock, kBlock / 2});
    open.push_back(Window(target_key, "a", extents));
  }
  absl::StatusOr<WindowKey> over = b_->OpenWindow(target_key, "a", {{{0, 1}}});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  if (mrs_before >= 0) {
    EXPECT_EQ(RdmaResources("mr"), mrs_before + 2 * static_cast<int>(kBudget));
  }
  DrainCounter drained;
  for (WindowKey key : open) b_->CloseWindow(key, drained.Callback());
  EXPECT_EQ(drained.WaitFor(16), 16);
  // Many more, opened and closed one after the other, each written through once.
  constexpr int kCycles = 100;
  double open_ms = 0, close_ms = 0;
  for (int i = 0; i < kCycles; ++i) {
    std::vector<Extent> extents;
    for (int e = 0; e < 4; ++e) extents.push_back({(e * 16 + i % 16) * kBlock, kBlock});
    auto t0 = Clock::now();
    const WindowKey key = Window(target_key, "a", extents);
    auto t1 = Clock::now();
    ASSERT_NE(key, 0u);
    ASSERT_TRUE(Post(i % 2, {.local_key = source_key,
                             .remote_key = key,
                             .remote_offset = extents[i % 4].offset,
                             .bytes = kBlock,
                             .wr_id = 100u + i})
                    .ok());
    std::optional<Completion> c = CompletionOf(100u + i);
    ASSERT_TRUE(c.has_value());
    EXPECT_TRUE(c->status.ok()) << c->status;
    auto t2 = Clock::now();
    b_->CloseWindow(key, drained.Callback());
    ASSERT_EQ(drained.WaitFor(17 + i), 17 + i);
    auto t3 = Clock::now();
    open_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    close_ms += std::chrono::duration<double, std::milli>(t3 - t2).count();
  }
  std::printf(
      "bench: OpenWindow of 4 extents on 2 NICs: %.2f ms; CloseWindow to drained: "
      "%.2f ms (mean of %d)\n",
      open_ms / kCycles, close_ms / kCycles, kCycles);
  const int mrs_after = RdmaResources("mr");
  const int pds_after = RdmaResources("pd");
  std::printf("leaks: after %d windows: %d MRs, %d PDs of this process\n", 16 + kCycles,
              mrs_after, pds_after);
  if (mrs_before >= 0) {
    EXPECT_EQ(mrs_after, mrs_before);
    EXPECT_EQ(pds_after, pds_before);
  } else {
    std::printf("leaks: `rdma resource show` unavailable: only the budget was checked\n");
  }
  // The budget is whole again.
  std::vector<Extent> all;
  for (uint32_t e = 0; e < kBudget; ++e) all.push_back({e * kBlock, kBlock / 2});
  const WindowKey full = Window(target_key, "a", all);
  EXPECT_NE(full, 0u);
  b_->CloseWindow(full, drained.Callback());
  EXPECT_EQ(drained.WaitFor(17 + kCycles), 17 + kCycles);
}

TEST_F(VerbsFabricTest, RailDownFailsItsWritesUnavailableExactlyOnce) {
  FL_MAKE(2, 2);
  const Rail rail = Rails()[1];
  if (rail.a_veth.empty()) GTEST_SKIP() << "FUSELINK_RDMA_VETHS is not set";
  constexpr size_t kChunk = 64 << 10;
  constexpr int kWrites = 400;  // ~26 MB on NIC 1: longer than the link stays up
  std::vector<uint8_t> source = RandomBytes(kChunk, 5);
  std::vector<uint8_t> target(kChunk * 2, kUntouched);
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  const WindowKey window = Window(target_key, "a", {{0, 2 * kChunk}});
  int posted = 0;
  std::thread downer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::system(absl::StrCat("ip link set ", rail.a_veth, " down").c_str());
  });
  const auto started = Clock::now();
  while (posted < kWrites && Clock::now() - started < std::chrono::seconds(20)) {
    WriteOp op{.local_key = source_key,
               .remote_key = window,
               .remote_offset = (posted % 2) * kChunk,
               .bytes = kChunk,
               .imm = 7,
               .wr_id = static_cast<uint64_t>(posted)};
    absl::Status status = a_->PostWrite(b_on_a_, 1, op);
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    if (!status.ok()) break;  // UNAVAILABLE: the rail is gone
    ++posted;
  }
  downer.join();
  ASSERT_TRUE(a_events_.WaitForCompletions(posted));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // no late duplicates
  std::map<uint64_t, int> seen;
  int ok = 0, unavailable = 0, other = 0;
  for (const Completion& c : a_events_.completions()) {
    ++seen[c.wr_id];
    if (c.status.ok()) {
      ++ok;
    } else if (c.status.code() == absl::StatusCode::kUnavailable) {
      ++unavailable;
    } else {
      ++other;
    }
  }
  std::printf("rail down: posted %d, completed OK %d, UNAVAILABLE %d, other %d; first "
              "failure: %s\n",
              posted, ok, unavailable, other,
              unavailable > 0 ? [&] {
                for (const Completion& c : a_events_.completions()) {
                  if (!c.status.ok()) return c.status.ToString();
                }
                return std::string();
              }().c_str() : "none");
  EXPECT_EQ(static_cast<int>(seen.size()), posted);
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << "wr_id " << id;
  EXPECT_GT(unavailable, 0);
  EXPECT_EQ(other, 0);
  // Rail 0 still works.
  WriteOp op{.local_key = source_key,
             .remote_key = window,
             .bytes = 4096,
             .imm = 8,
             .wr_id = 100000};
  absl::Status status = a_->PostWrite(b_on_a_, 0, op);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(a_->PostWrite(b_on_a_, 1, op).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(a_events_.WaitForCompletions(posted + 1));
  EXPECT_TRUE(a_events_.completions().back().status.ok());
  std::system(absl::StrCat("ip link set ", rail.a_veth, " up").c_str());
  std::system(absl::StrCat("ip link set ", rail.b_veth, " up").c_str());
  std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Not a pass/fail test: the numbers docs/verbs.md quotes, from the same VM run as
// ib_write_bw.
// A control connection under a's name that cannot prove a's key: closed before b
// makes a QP or shows a window, counted, and the real a still connects and writes.
TEST_F(VerbsFabricTest, ImpostorControlConnectionGetsNothing) {
  FL_MAKE_UNCONNECTED(1, 1);
  std::vector<uint8_t> target(4096, 0xAB);
  const RegionKey target_key = Region(*b_, target);
  const WindowKey window = Window(target_key, "a", {{0, target.size()}});

  absl::StatusOr<SocketAddress> from = ParseSocketAddress(a_->endpoints()[0].address, 0);
  absl::StatusOr<SocketAddress> to =
      ParseSocketAddress(b_->endpoints()[0].address, b_->endpoints()[0].port);
  ASSERT_TRUE(from.ok() && to.ok());
  absl::StatusOr<UniqueFd> raw = ConnectFrom(*from, *to, 5000);
  ASSERT_TRUE(raw.ok()) << raw.status();
  verbs::wire::Hello hello{.nic = 0, .mtu = IBV_MTU_1024, .name = "a", .qps = {}};
  hello.qps = {{.qpn = 1234, .psn = 1}};
  hello.client_nonce = *handshake::NewNonce();
  const std::string hello_bytes = *verbs::wire::EncodeHello(hello);
  ASSERT_TRUE(testing::SendRaw(raw->get(), hello_bytes.data(), hello_bytes.size()).ok());
  verbs::wire::Frame frame;
  ASSERT_TRUE(RecvAll(raw->get(), frame.data(), frame.size()).ok());
  absl::StatusOr<verbs::wire::Decoded> decoded = verbs::wire::DecodeFrame(frame);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto* challenge = std::get_if<verbs::wire::Challenge>(&*decoded);
  ASSERT_NE(challenge, nullptr) << "b knows a: it challenges";
  const handshake::Mac forged =
      *handshake::ComputeMac(*RandomKey(), handshake::Side::kConnector,
                             {.connector = "a",
                              .acceptor = "b",
                              .nic = 0,
                              .client_nonce = hello.client_nonce,
                              .server_nonce = challenge->server_nonce});
  const verbs::wire::Frame proof = verbs::wire::EncodeProof({.mac = forged});
  (void)testing::SendRaw(raw->get(), proof.data(), proof.size());
  EXPECT_TRUE(testing::WaitUntilClosed(raw->get()));
  EXPECT_EQ(b_->counters(0).auth_failures, 1u);
  EXPECT_FALSE(b_->FindPeer("a").has_value());

  ConnectAB();
  if (HasFatalFailure()) return;
  std::vector<uint8_t> source(16, 'R');
  const RegionKey source_key = Region(*a_, source);
  ASSERT_TRUE(Post(0, {.local_key = source_key,
                       .remote_key = window,
                       .remote_offset = 64,
                       .bytes = 16,
                       .wr_id = 1})
                  .ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(1));
  EXPECT_TRUE(a_events_.completions()[0].status.ok())
      << a_events_.completions()[0].status;
  EXPECT_EQ(std::memcmp(&target[64], source.data(), 16), 0);
  EXPECT_EQ(target[0], 0xAB);
}

TEST_F(VerbsFabricTest, ConnectToATargetThatCannotProveItsKeyFails) {
  FL_MAKE_UNCONNECTED(1, 1);
  keys_.For("a")->SetConnectKey("b", *RandomKey());
  absl::StatusOr<PeerId> peer = a_->Connect("b", b_->endpoints());
  ASSERT_EQ(peer.status().code(), absl::StatusCode::kUnavailable) << peer.status();
  EXPECT_EQ(ReasonOf(peer.status()), handshake::kAuthReason) << peer.status();
  EXPECT_FALSE(b_->FindPeer("a").has_value());
}

// A target whose kernel takes the control connection and nobody answers: shutdown's
// CancelConnects ends the handshake at once.
TEST_F(VerbsFabricTest, CancelConnectsEndsAControlHandshakeNobodyAnswers) {
  FL_MAKE_UNCONNECTED(1, 1);
  keys_.For("hole");
  Endpoint hole;
  absl::StatusOr<UniqueFd> listener =
      testing::DeafListener(b_->endpoints()[0].address, 64, &hole);
  ASSERT_TRUE(listener.ok()) << listener.status();
  testing::ExpectCancelEndsTheConnect(*a_, hole);
}

TEST_F(VerbsFabricTest, Throughput) {
  FL_MAKE(1, 2);
  for (uint32_t chunk : {64u << 10, 1u << 20}) {
    std::vector<uint8_t> source = RandomBytes(chunk, 1);
    std::vector<uint8_t> target(chunk, 0);
    const RegionKey source_key = Region(*a_, source);
    const RegionKey target_key = Region(*b_, target);
    const WindowKey window = Window(target_key, "a", {{0, chunk}});
    const size_t before = a_events_.completions().size();
    size_t posted = 0;
    const auto started = Clock::now();
    while (Clock::now() - started < std::chrono::seconds(5)) {
      WriteOp op{
          .local_key = source_key, .remote_key = window, .bytes = chunk, .wr_id = posted};
      absl::Status status = a_->PostWrite(b_on_a_, 0, op);
      if (status.ok()) {
        ++posted;
      } else {
        ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    ASSERT_TRUE(a_events_.WaitForCompletions(before + posted));
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    std::printf(
        "bench: fuselink verbs write %u B x %zu over 1 NIC, 2 QPs: %.3f Gbit/s "
        "(%.1f MB/s)\n",
        chunk, posted, posted * chunk * 8 / seconds / 1e9,
        posted * chunk / seconds / 1e6);
  }
  std::vector<uint8_t> big(256 << 20, 1);
  const auto started = Clock::now();
  absl::StatusOr<RegionKey> key = a_->RegisterRegion(big.data(), big.size(), nullptr);
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  ASSERT_TRUE(key.ok());
  std::printf("bench: register 256 MiB on 1 NIC: %.1f ms = %.0f ms per GiB\n",
              seconds * 1e3, seconds * 4e3);
}

// GPU regions on verbs where no NIC reaches GPU memory (the VM: no dma-buf, no peer
// memory): both sides stage through the stand-in stager, whose "device memory" is
// host memory.
class VerbsGpuTest : public VerbsFabricTest {
 protected:
  static constexpr uint32_t kSlotBytes = 64 << 10;
  void MakeStaged(int nic_count, uint64_t max_shadow_bytes = uint64_t{1} << 30,
                  uint32_t slot_bytes = kSlotBytes, int qps = 2) {
    auto gpus = [=](testing::HostStager* stager) {
      return [=](VerbsFabricOptions& o) {
        o.device_stager = stager;
        o.gpu_count = 2;
        o.staging_slots_per_nic = 4;
        o.staging_slot_bytes = slot_bytes;
        o.max_shadow_bytes = max_shadow_bytes;
      };
    };
    Make(nic_count, qps, gpus(&b_stager_), gpus(&a_stager_));
  }
  // A GPU region of `memory` on `gpu`.
  RegionKey DeviceRegion(Fabric& fabric, std::vector<uint8_t>& memory, int gpu) {
    absl::StatusOr<RegionKey> key = fabric.RegisterDeviceRegion(
        reinterpret_cast<uint64_t>(memory.data()), memory.size(), gpu, nullptr);
    EXPECT_TRUE(key.ok()) << key.status();
    return key.value_or(0);
  }

  // a's completions from the `from`th on that failed: "none", or how many and the
  // first one's status.
  std::string Failed(size_t from) const {
    const std::vector<Completion> done = a_events_.completions();
    size_t failed = 0;
    std::string first;
    for (size_t i = from; i < done.size(); ++i) {
      if (done[i].status.ok()) continue;
      if (failed++ == 0) first = done[i].status.ToString();
    }
    return failed == 0 ? "none" : absl::StrCat(failed, ", the first: ", first);
  }

  testing::HostStager a_stager_, b_stager_;  // outlive the fabrics
  testing::Buffers buffers_;
};

#define FL_MAKE_STAGED(...)                       \
  do {                                            \
    MakeStaged(__VA_ARGS__);                      \
    if (HasFatalFailure() || IsSkipped()) return; \
  } while (0)

// GPU to GPU and host to GPU, staged on both sides over two NICs: every byte lands
// where it should and nowhere else, and an arrival is delivered only once its bytes
// are in GPU memory.
TEST_F(VerbsGpuTest, StagedWritesLandExactlyOnBothSides) {
  FL_MAKE_STAGED(2);
  for (int nic = 0; nic < 2; ++nic) {
    EXPECT_EQ(a_->GpuPath(0, nic), "staged");
    EXPECT_EQ(b_->GpuPath(1, nic), "staged");
  }
  EXPECT_EQ(a_->GpuPath(2, 0), "none");
  constexpr size_t kWrites = 64;
  std::vector<uint8_t>& gpu_source = buffers_.Keep(ManyBytes(kWrites * kSlotBytes, 1));
  std::vector<uint8_t>& host_source = buffers_.Keep(ManyBytes(kWrites * kSlotBytes, 2));
  std::vector<uint8_t>& target =
      buffers_.Keep(std::vector<uint8_t>(kWrites * kSlotBytes, kUntouched));
  std::vector<uint8_t> expected = target;
  const RegionKey from_gpu = DeviceRegion(*a_, gpu_source, 0);
  const RegionKey from_host = Region(*a_, host_source);
  const RegionKey into = DeviceRegion(*b_, target, 1);
  const WindowKey window = Window(into, "a", {{0, target.size()}});

  std::mt19937 random(3);
  std::vector<WriteOp> ops;
  uint64_t staged_out = 0, staged_in = 0;
  for (size_t i = 0; i < kWrites; ++i) {
    const uint32_t bytes = 1 + random() % kSlotBytes;
    const uint64_t remote = i * kSlotBytes + random() % (kSlotBytes - bytes + 1);
    const uint64_t local = random() % (kWrites * kSlotBytes - bytes + 1);
    const bool gpu = i % 3 != 2;
    std::memcpy(&expected[remote], &(gpu ? gpu_source : host_source)[local], bytes);
    if (gpu) staged_out += bytes;
    staged_in += bytes;
    ops.push_back({.local_key = gpu ? from_gpu : from_host,
                   .local_offset = local,
                   .remote_key = window,
                   .remote_offset = remote,
                   .bytes = bytes,
                   .imm = static_cast<uint32_t>(i),
                   .wr_id = i});
  }
  std::atomic<int> early{0};
  b_events_.SetCheck([&](const Arrival& arrival) {
    if (std::memcmp(&target[arrival.offset], &expected[arrival.offset], arrival.bytes))
      ++early;
  });
  for (size_t i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(Post(static_cast<int>(i % 2), ops[i]).ok()) << i;
  }
  ASSERT_TRUE(a_events_.WaitForCompletions(kWrites));
  ASSERT_TRUE(b_events_.WaitForArrivals(kWrites));
  for (const Completion& c : a_events_.completions()) {
    EXPECT_TRUE(c.status.ok()) << c.wr_id << ": " << c.status;
  }
  EXPECT_EQ(early, 0) << "arrivals delivered before their bytes were in GPU memory";
  EXPECT_TRUE(target == expected) << "target bytes differ";
  EXPECT_EQ(a_stager_.log().to_host_bytes, staged_out);
  EXPECT_EQ(a_stager_.log().last_source_gpu, 0);
  EXPECT_EQ(b_stager_.log().to_device_bytes, staged_in);
  EXPECT_EQ(b_stager_.log().last_target_gpu, 1);
  EXPECT_EQ(b_->counters(0).received_bytes + b_->counters(1).received_bytes, staged_in);
  b_events_.SetCheck(nullptr);

  // The window's shadow is freed with its close; a's bounce slots stay for reuse.
  EXPECT_GT(b_stager_.log().pinned_bytes, 0u);
  DrainCounter drained;
  b_->CloseWindow(window, drained.Callback());
  EXPECT_EQ(drained.WaitFor(1), 1);
  EXPECT_EQ(b_stager_.log().pinned_bytes, 0u);
  EXPECT_EQ(a_stager_.log().pinned_bytes, 2 * 4 * kSlotBytes);  // 4 slots on each NIC
}

// A relayed send: the source is in a relay slot on another GPU, written by a copy the
// write must wait for. A fence that fails and a staging copy that fails each fail
// their own write (UNAVAILABLE: the engine sends it over another NIC), place nothing,
// and the next write goes through.
TEST_F(VerbsGpuTest, RelayedSendsWaitForTheirFenceAndAFaultFailsOnlyItsWrite) {
  FL_MAKE_STAGED(1);
  // The relay's copy into the slot is what the fence stands for: the slot holds its
  // bytes only once the fence is waited for.
  const std::vector<uint8_t> relayed = ManyBytes(4 * kSlotBytes, 4);
  std::vector<uint8_t>& slot = buffers_.Keep(std::vector<uint8_t>(4 * kSlotBytes, 0));
  std::vector<uint8_t>& target =
      buffers_.Keep(std::vector<uint8_t>(4 * kSlotBytes, kUntouched));
  const RegionKey from = DeviceRegion(*a_, slot, 1);
  const WindowKey window = Window(Region(*b_, target), "a", {{0, target.size()}});
  auto op = [&](uint64_t i, Fence* after) {
    return WriteOp{.local_key = from,
                   .local_offset = i * kSlotBytes,
                   .remote_key = window,
                   .remote_offset = i * kSlotBytes,
                   .bytes = kSlotBytes,
                   .imm = static_cast<uint32_t>(i),
                   .wr_id = i,
                   .after = after};
  };
  auto landed = [&](uint64_t i) {
    return std::memcmp(&target[i * kSlotBytes], &relayed[i * kSlotBytes], kSlotBytes) ==
           0;
  };
  auto untouched = [&](uint64_t i) {
    return std::all_of(target.begin() + i * kSlotBytes,
                       target.begin() + (i + 1) * kSlotBytes,
                       [](uint8_t b) { return b == kUntouched; });
  };
  auto relay = [&](uint64_t i) {
    return [&, i] {
      std::memcpy(&slot[i * kSlotBytes], &relayed[i * kSlotBytes], kSlotBytes);
    };
  };
  testing::CountingFence passes(absl::OkStatus(), relay(0));
  testing::CountingFence fails(absl::InternalError("the relay copy faulted"));

  ASSERT_TRUE(Post(0, op(0, &passes)).ok());
  std::optional<Completion> first = CompletionOf(0);
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(first->status.ok()) << first->status;
  EXPECT_EQ(passes.waits, 1);

  ASSERT_TRUE(Post(0, op(1, &fails)).ok());
  std::optional<Completion> fenced = CompletionOf(1);
  ASSERT_TRUE(fenced.has_value());
  EXPECT_EQ(fenced->status.code(), absl::StatusCode::kUnavailable) << fenced->status;
  EXPECT_EQ(fails.waits, 1);

  relay(2)();
  relay(3)();
  a_stager_.log().fail_copy = a_stager_.log().copies + 1;
  ASSERT_TRUE(Post(0, op(2, nullptr)).ok());
  std::optional<Completion> faulted = CompletionOf(2);
  ASSERT_TRUE(faulted.has_value());
  EXPECT_EQ(faulted->status.code(), absl::StatusCode::kUnavailable) << faulted->status;

  ASSERT_TRUE(Post(0, op(3, nullptr)).ok());
  std::optional<Completion> after = CompletionOf(3);
  ASSERT_TRUE(after.has_value());
  EXPECT_TRUE(after->status.ok()) << after->status;
  ASSERT_TRUE(b_events_.WaitForArrivals(2));
  EXPECT_TRUE(landed(0));
  EXPECT_TRUE(untouched(1));
  EXPECT_TRUE(untouched(2));
  EXPECT_TRUE(landed(3));
  EXPECT_EQ(b_events_.arrivals().size(), 2u);
}

// A staged arrival whose copy into GPU memory fails is not delivered (the transfer's
// landing misses its bytes and says so in its verdict); the NIC's next arrival is.
TEST_F(VerbsGpuTest, AStagedArrivalWhoseCopyFailsIsNotDelivered) {
  // One QP: the two writes arrive in their order, so the fault hits the first.
  FL_MAKE_STAGED(1, uint64_t{1} << 30, kSlotBytes, /*qps=*/1);
  std::vector<uint8_t>& source = buffers_.Keep(ManyBytes(2 * kSlotBytes, 5));
  std::vector<uint8_t>& target =
      buffers_.Keep(std::vector<uint8_t>(2 * kSlotBytes, kUntouched));
  const RegionKey from = Region(*a_, source);
  const WindowKey window =
      Window(DeviceRegion(*b_, target, 0), "a", {{0, target.size()}});
  b_stager_.log().fail_copy = b_stager_.log().copies + 1;
  for (uint64_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(Post(0, {.local_key = from,
                         .local_offset = i * kSlotBytes,
                         .remote_key = window,
                         .remote_offset = i * kSlotBytes,
                         .bytes = kSlotBytes,
                         .imm = static_cast<uint32_t>(10 + i),
                         .wr_id = i})
                    .ok());
  }
  ASSERT_TRUE(a_events_.WaitForCompletions(2));
  for (const Completion& c : a_events_.completions()) EXPECT_TRUE(c.status.ok());
  ASSERT_TRUE(b_events_.WaitForArrivals(1));
  const std::vector<Arrival> arrivals = b_events_.arrivals();
  ASSERT_EQ(arrivals.size(), 1u);
  EXPECT_EQ(arrivals[0].imm, 11u);
  EXPECT_EQ(std::memcmp(&target[kSlotBytes], &source[kSlotBytes], kSlotBytes), 0);
  EXPECT_EQ(b_->counters(0).received_bytes, kSlotBytes);
}

// What a caller gets wrong, each with its code; the fabric goes on.
TEST_F(VerbsGpuTest, BadGpuRequestsGetTheirCode) {
  FL_MAKE_STAGED(1, /*max_shadow_bytes=*/kSlotBytes + 4096);  // + in-page offset
  std::vector<uint8_t>& memory = buffers_.Keep(ManyBytes(4 * kSlotBytes, 6));
  std::vector<uint8_t>& target =
      buffers_.Keep(std::vector<uint8_t>(4 * kSlotBytes, kUntouched));
  EXPECT_EQ(a_->RegisterDeviceRegion(reinterpret_cast<uint64_t>(memory.data()),
                                     memory.size(), 2, nullptr)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a_->RegisterDeviceRegion(0, memory.size(), 0, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  const RegionKey into = DeviceRegion(*b_, target, 0);
  // The shadow budget: one slot's worth (and its in-page offset), so a window of two
  // slots does not fit.
  EXPECT_EQ(
      b_->OpenWindow(into, "a", std::vector<Extent>{{0, 2 * kSlotBytes}}).status().code(),
      absl::StatusCode::kResourceExhausted);
  const WindowKey window = Window(into, "a", {{0, kSlotBytes}});
  const RegionKey from = DeviceRegion(*a_, memory, 0);
  // A staged write is at most one bounce slot.
  EXPECT_EQ(a_->PostWrite(b_on_a_, 0,
                          {.local_key = from,
                           .remote_key = window,
                           .bytes = kSlotBytes + 1,
                           .wr_id = 1})
                .code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(
      Post(0, {.local_key = from, .remote_key = window, .bytes = kSlotBytes, .wr_id = 2})
          .ok());
  std::optional<Completion> done = CompletionOf(2);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->status.ok()) << done->status;
  ASSERT_TRUE(b_events_.WaitForArrivals(1));
  EXPECT_EQ(std::memcmp(target.data(), memory.data(), kSlotBytes), 0);
}

// Not a pass/fail test: verbs writes of 1 MiB out of and into "GPU" memory that the
// NIC reaches only by staging, beside host memory to host memory on the same link, in
// rounds that alternate (docs/benchmarks.md).
TEST_F(VerbsGpuTest, ThroughputStagedAgainstHostMemory) {
  constexpr uint32_t kChunk = 1 << 20;
  constexpr int kDepth = 8;  // writes in flight, as the engine's window keeps them
  FL_MAKE_STAGED(1, uint64_t{1} << 30, kChunk);
  std::vector<uint8_t>& a_host = buffers_.Keep(ManyBytes(kChunk, 7));
  std::vector<uint8_t>& a_gpu = buffers_.Keep(ManyBytes(kChunk, 8));
  std::vector<uint8_t>& b_host = buffers_.Keep(std::vector<uint8_t>(kDepth * kChunk));
  std::vector<uint8_t>& b_gpu = buffers_.Keep(std::vector<uint8_t>(kDepth * kChunk));
  const RegionKey from[2] = {Region(*a_, a_host), DeviceRegion(*a_, a_gpu, 0)};
  const WindowKey into[2] = {
      Window(Region(*b_, b_host), "a", {{0, b_host.size()}}),
      Window(DeviceRegion(*b_, b_gpu, 0), "a", {{0, b_gpu.size()}})};
  const char* kSide[2] = {"host", "staged GPU"};
  uint64_t wr_id = 0;
  for (int round = 0; round < 2; ++round) {
    for (int variant = 0; variant < 4; ++variant) {
      const int src = variant & 1, dst = variant >> 1;
      const size_t before = a_events_.completions().size();
      const size_t delivered = b_events_.arrivals().size();
      size_t posted = 0;
      const auto started = Clock::now();
      while (Clock::now() - started < std::chrono::seconds(3)) {
        // In flight until delivered at b (after the landing's copy), not just ACKed. A
        // write that failed is never delivered: the wait is bounded, and the checks
        // below then say what went wrong instead of the loop spinning forever.
        const auto give_up = Clock::now() + std::chrono::seconds(20);
        const auto waiting = [&] {
          return posted - (b_events_.arrivals().size() - delivered);
        };
        while (waiting() >= kDepth && Clock::now() < give_up) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        ASSERT_LT(waiting(), kDepth)
            << "no arrival for 20 s; " << Failed(before) << " of the completions failed";
        ASSERT_TRUE(Post(0, {.local_key = from[src],
                             .remote_key = into[dst],
                             .remote_offset = (posted % kDepth) * kChunk,
                             .bytes = kChunk,
                             .wr_id = wr_id++})
                        .ok());
        ++posted;
      }
      ASSERT_TRUE(a_events_.WaitForCompletions(before + posted))
          << a_events_.completions().size() - before << " of " << posted << " completed";
      ASSERT_EQ(Failed(before), "none");
      ASSERT_TRUE(b_events_.WaitForArrivals(delivered + posted))
          << b_events_.arrivals().size() - delivered << " of " << posted
          << " arrived, all completed OK";
      const double seconds =
          std::chrono::duration<double>(Clock::now() - started).count();
      std::printf("bench: verbs 1 MiB writes, %s -> %s, round %d: %.3f Gbit/s\n",
                  kSide[src], kSide[dst], round, posted * kChunk * 8 / seconds / 1e9);
    }
  }
  for (const Completion& c : a_events_.completions()) ASSERT_TRUE(c.status.ok());
}

// Without a device stager the fabric refuses GPU memory, saying why.
TEST_F(VerbsFabricTest, GpuRegionsNeedAStager) {
  FL_MAKE(1, 1);
  std::vector<uint8_t> memory(4096);
  EXPECT_EQ(a_->GpuPath(0, 0), "none");
  EXPECT_EQ(a_->RegisterDeviceRegion(reinterpret_cast<uint64_t>(memory.data()),
                                     memory.size(), 0, nullptr)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace fuselink::fabric

// The device tests skip where no RDMA device is configured; then the binary says so
// to ctest (SKIP_RETURN_CODE 77) instead of passing: the pure tests ran, the verbs
// fabric did not. Replaces gtest_main's main.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (rc == 0 && !fuselink::fabric::SkipReason().empty() &&
      ::testing::UnitTest::GetInstance()->skipped_test_count() > 0) {
    std::printf("rdma_test: device tests skipped: %s\n",
                fuselink::fabric::SkipReason().c_str());
    return 77;
  }
  return rc;
}
