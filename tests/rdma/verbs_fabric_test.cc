// The verbs fabric on real RDMA devices: two fabrics in one process, "a" on the A ends
// of the rails and "b" on the B ends. FUSELINK_RDMA_RAILS="a0,b0;a1,b1" names each
// rail's two IPv4 addresses, FUSELINK_RDMA_VETHS="vA0,vB0;..." their interfaces
// (scripts/rdma-vm.sh sets both inside its Soft-RoCE VM). Skips, saying why, elsewhere.
#include "agent/fabric/verbs_fabric.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/fabric/verbs_device.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"

namespace fuselink::fabric {
namespace {

using testing::RecordingHandler;
using Clock = std::chrono::steady_clock;

constexpr uint8_t kUntouched = 0xAB;

struct Rail {
  std::string a, b;            // addresses
  std::string a_veth, b_veth;  // interfaces
};

std::vector<std::pair<std::string, std::string>> Pairs(const char* env) {
  std::vector<std::pair<std::string, std::string>> out;
  const char* value = std::getenv(env);
  if (value == nullptr) return out;
  for (absl::string_view rail : absl::StrSplit(value, ';', absl::SkipEmpty())) {
    std::vector<std::string> ends = absl::StrSplit(rail, ',');
    if (ends.size() == 2) out.push_back({ends[0], ends[1]});
  }
  return out;
}

std::vector<Rail> Rails() {
  std::vector<Rail> rails;
  auto addresses = Pairs("FUSELINK_RDMA_RAILS");
  auto veths = Pairs("FUSELINK_RDMA_VETHS");
  for (size_t i = 0; i < addresses.size(); ++i) {
    Rail rail{
        .a = addresses[i].first, .b = addresses[i].second, .a_veth = "", .b_veth = ""};
    if (i < veths.size()) std::tie(rail.a_veth, rail.b_veth) = veths[i];
    rails.push_back(rail);
  }
  return rails;
}

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

VerbsFabricOptions Options(std::string name, bool a_side, int nic_count, int qps) {
  VerbsFabricOptions options;
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

class VerbsFabricTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = SkipReason(); !why.empty()) GTEST_SKIP() << why;
  }
  // Creates a and b over `nic_count` rails and connects a to b.
  void Make(int nic_count, int qps) {
    if (static_cast<int>(Rails().size()) < nic_count) {
      GTEST_SKIP() << "needs " << nic_count << " rails in FUSELINK_RDMA_RAILS";
    }
    auto a = CreateVerbsFabric(Options("a", true, nic_count, qps), &a_events_);
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = *std::move(a);
    auto b = CreateVerbsFabric(Options("b", false, nic_count, qps), &b_events_);
    ASSERT_TRUE(b.ok()) << b.status();
    b_ = *std::move(b);
    const auto started = Clock::now();
    absl::StatusOr<PeerId> peer = a_->Connect("b", b_->endpoints());
    connect_seconds_ = std::chrono::duration<double>(Clock::now() - started).count();
    ASSERT_TRUE(peer.ok()) << peer.status();
    b_on_a_ = *peer;
    std::printf("bench: connect %d NICs x %d QPs: %.1f ms, %.2f ms per QP\n", nic_count,
                qps, connect_seconds_ * 1e3, connect_seconds_ * 1e3 / (nic_count * qps));
  }
  // A region of `bytes` filled with `fill`, registered on `fabric`.
  RegionKey Region(Fabric& fabric, std::vector<uint8_t>& memory) {
    absl::StatusOr<RegionKey> key =
        fabric.RegisterRegion(memory.data(), memory.size(), nullptr);
    EXPECT_TRUE(key.ok()) << key.status();
    return key.value_or(0);
  }

  RecordingHandler a_events_;
  RecordingHandler b_events_;
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
  Make(2, 4);
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
  Make(nic_count, qps);
  constexpr size_t kBytes = 4 << 20;
  std::vector<uint8_t> source = RandomBytes(kBytes, 7);
  std::vector<uint8_t> target(kBytes + 8192, kUntouched);
  const RegionKey source_key = Region(*a_, source);
  // The region is the middle of `target`: 4 KiB either side must stay untouched.
  absl::StatusOr<RegionKey> target_key =
      b_->RegisterRegion(target.data() + 4096, kBytes, nullptr);
  ASSERT_TRUE(target_key.ok()) << target_key.status();
  // Writes of random sizes covering the region except a hole at [1 MiB, 1 MiB + 100).
  std::mt19937 random(11);
  std::vector<WriteOp> ops;
  for (uint64_t offset = 0; offset < kBytes;) {
    uint32_t bytes = std::min<uint64_t>(1 + random() % (256 << 10), kBytes - offset);
    if (offset < (1 << 20) && offset + bytes > (1 << 20)) bytes = (1 << 20) - offset;
    if (offset == (1 << 20)) {
      offset += 100;
      continue;
    }
    ops.push_back({.local_key = source_key,
                   .local_offset = offset,
                   .remote_key = *target_key,
                   .remote_offset = offset,
                   .bytes = bytes,
                   .imm = static_cast<uint32_t>(ops.size()),
                   .wr_id = ops.size()});
    offset += bytes;
  }
  ops.push_back({.imm = 0xC0FFEE, .wr_id = ops.size()});  // a notification
  for (size_t i = 0; i < ops.size(); ++i) {
    absl::Status posted;
    do {  // RESOURCE_EXHAUSTED is back-pressure: wait for completions
      posted = a_->PostWrite(b_on_a_, static_cast<int>(i % nic_count), ops[i]);
      if (posted.code() == absl::StatusCode::kResourceExhausted) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } while (posted.code() == absl::StatusCode::kResourceExhausted);
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
    EXPECT_EQ(arrival.peer != 0, true);
    if (arrival.bytes == 0) {
      notified = arrival.imm == 0xC0FFEE;
      continue;
    }
    EXPECT_EQ(arrival.window, *target_key);
    EXPECT_EQ(ops[arrival.imm].remote_offset, arrival.offset);
  }
  EXPECT_TRUE(notified);
  for (size_t i = 0; i < 4096; ++i) {
    ASSERT_EQ(target[i], kUntouched) << "before the region, byte " << i;
    ASSERT_EQ(target[4096 + kBytes + i], kUntouched) << "after the region, byte " << i;
  }
  for (size_t i = 0; i < kBytes; ++i) {
    const bool hole = i >= (1 << 20) && i < (1 << 20) + 100;
    ASSERT_EQ(target[4096 + i], hole ? kUntouched : source[i]) << "byte " << i;
  }
  uint64_t sent = 0, received = 0;
  for (int nic = 0; nic < nic_count; ++nic) {
    sent += a_->counters(nic).transmitted_bytes;
    received += b_->counters(nic).received_bytes;
  }
  EXPECT_EQ(sent, kBytes - 100);
  EXPECT_EQ(received, kBytes - 100);
}

INSTANTIATE_TEST_SUITE_P(Rails, VerbsWriteTest,
                         ::testing::Values(std::pair{1, 2}, std::pair{2, 3}));

TEST_F(VerbsFabricTest, WriteBeyondTheRemoteRegionFailsOnlyThatWrite) {
  Make(2, 2);
  std::vector<uint8_t> source = RandomBytes(64 << 10, 3);
  std::vector<uint8_t> target(128 << 10, kUntouched);
  const RegionKey source_key = Region(*a_, source);
  // Registered: the first 64 KiB only.
  absl::StatusOr<RegionKey> target_key =
      b_->RegisterRegion(target.data(), 64 << 10, nullptr);
  ASSERT_TRUE(target_key.ok());
  WriteOp bad{.local_key = source_key,
              .remote_key = *target_key,
              .remote_offset = 60 << 10,
              .bytes = 8 << 10,
              .imm = 1,
              .wr_id = 1};
  ASSERT_TRUE(a_->PostWrite(b_on_a_, 0, bad).ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(1));
  const Completion failed = a_events_.completions()[0];
  EXPECT_EQ(failed.wr_id, 1u);
  EXPECT_EQ(failed.status.code(), absl::StatusCode::kOutOfRange) << failed.status;
  std::printf("out-of-bounds write completes: %s\n", failed.status.ToString().c_str());
  for (size_t i = 0; i < target.size(); ++i) ASSERT_EQ(target[i], kUntouched) << i;
  // The other QP on NIC 0, and NIC 1, still carry writes.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (uint64_t id = 2; id < 6; ++id) {
    WriteOp good{.local_key = source_key,
                 .local_offset = 0,
                 .remote_key = *target_key,
                 .remote_offset = (id - 2) * 4096,
                 .bytes = 4096,
                 .imm = 2,
                 .wr_id = id};
    absl::Status posted = a_->PostWrite(b_on_a_, static_cast<int>(id % 2), good);
    ASSERT_TRUE(posted.ok()) << posted;
  }
  ASSERT_TRUE(a_events_.WaitForCompletions(5));
  for (const Completion& c : a_events_.completions()) {
    if (c.wr_id != 1) {
      EXPECT_TRUE(c.status.ok()) << c.wr_id << ": " << c.status;
    }
  }
  for (size_t i = 0; i < 4 * 4096; ++i) ASSERT_EQ(target[i], source[i % 4096]) << i;
  for (size_t i = 4 * 4096; i < target.size(); ++i) ASSERT_EQ(target[i], kUntouched) << i;
  // The target refused nothing itself: the NIC did.
  EXPECT_EQ(b_events_.arrivals().size(), 4u);
}

TEST_F(VerbsFabricTest, RailDownFailsItsWritesUnavailableExactlyOnce) {
  Make(2, 2);
  const Rail rail = Rails()[1];
  if (rail.a_veth.empty()) GTEST_SKIP() << "FUSELINK_RDMA_VETHS is not set";
  constexpr size_t kChunk = 64 << 10;
  constexpr int kWrites = 400;  // ~26 MB on NIC 1: longer than the link stays up
  std::vector<uint8_t> source = RandomBytes(kChunk, 5);
  std::vector<uint8_t> target(kChunk * 2, kUntouched);
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  int posted = 0;
  std::thread downer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::system(absl::StrCat("ip link set ", rail.a_veth, " down").c_str());
  });
  const auto started = Clock::now();
  while (posted < kWrites && Clock::now() - started < std::chrono::seconds(20)) {
    WriteOp op{.local_key = source_key,
               .remote_key = target_key,
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
             .remote_key = target_key,
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
TEST_F(VerbsFabricTest, Throughput) {
  Make(1, 2);
  for (uint32_t chunk : {64u << 10, 1u << 20}) {
    std::vector<uint8_t> source = RandomBytes(chunk, 1);
    std::vector<uint8_t> target(chunk, 0);
    const RegionKey source_key = Region(*a_, source);
    const RegionKey target_key = Region(*b_, target);
    const size_t before = a_events_.completions().size();
    size_t posted = 0;
    const auto started = Clock::now();
    while (Clock::now() - started < std::chrono::seconds(5)) {
      WriteOp op{.local_key = source_key,
                 .remote_key = target_key,
                 .bytes = chunk,
                 .wr_id = posted};
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

}  // namespace
}  // namespace fuselink::fabric
