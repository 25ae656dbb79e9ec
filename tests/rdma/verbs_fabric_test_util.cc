// The shared fixture and helpers of the verbs fabric's device tests.
#include "tests/rdma/verbs_fabric_test_util.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include "absl/status/statusor.h"

namespace fuselink::fabric::testing {
namespace {

using Clock = std::chrono::steady_clock;

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

}  // namespace

std::vector<Rail> Rails() { return testing::RailsFrom("FUSELINK_RDMA_RAILS"); }

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

void VerbsFabricTest::SetUp() {
  if (std::string why = SkipReason(); !why.empty()) GTEST_SKIP() << why;
}

void VerbsFabricTest::Create(int nic_count, int qps,
                             const std::function<void(VerbsFabricOptions&)>& tune_b,
                             const std::function<void(VerbsFabricOptions&)>& tune_a) {
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

void VerbsFabricTest::ConnectAB() {
  const auto started = Clock::now();
  absl::StatusOr<PeerId> peer = a_->Connect("b", b_->endpoints());
  connect_seconds_ = std::chrono::duration<double>(Clock::now() - started).count();
  ASSERT_TRUE(peer.ok()) << peer.status();
  b_on_a_ = *peer;
  std::printf("bench: connect %d NICs x QPs: %.1f ms\n", a_->nic_count(),
              connect_seconds_ * 1e3);
}

void VerbsFabricTest::Make(int nic_count, int qps,
                           const std::function<void(VerbsFabricOptions&)>& tune_b,
                           const std::function<void(VerbsFabricOptions&)>& tune_a) {
  Create(nic_count, qps, tune_b, tune_a);
  if (HasFatalFailure() || IsSkipped()) return;
  ConnectAB();
}

RegionKey VerbsFabricTest::Region(Fabric& fabric, std::vector<uint8_t>& memory) {
  absl::StatusOr<RegionKey> key =
      fabric.RegisterRegion(memory.data(), memory.size(), nullptr);
  EXPECT_TRUE(key.ok()) << key.status();
  return key.value_or(0);
}

WindowKey VerbsFabricTest::Window(RegionKey region, absl::string_view peer,
                                  std::vector<Extent> extents) {
  absl::StatusOr<WindowKey> key = b_->OpenWindow(region, peer, extents);
  EXPECT_TRUE(key.ok()) << key.status();
  return key.value_or(0);
}

absl::Status VerbsFabricTest::Post(int nic, const WriteOp& op) {
  while (true) {
    absl::Status posted = a_->PostWrite(b_on_a_, nic, op);
    if (posted.code() != absl::StatusCode::kResourceExhausted) return posted;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::optional<Completion> VerbsFabricTest::CompletionOf(uint64_t wr_id) {
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

}  // namespace fuselink::fabric::testing
