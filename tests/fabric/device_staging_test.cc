// The TCP fabric's path for GPU regions, with a stager whose "device memory" is host
// memory: pieces, the two buffers, odd sizes, the landing GPU, fences. What CUDA does
// inside the real stage is tested on GPU machines (tests/gpu).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/fabric/tcp/fabric.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"

namespace fuselink::fabric {
namespace {

using testing::CountingFence;
using testing::HostStager;
using testing::LoopbackOptions;
using testing::RecordingHandler;

constexpr uint32_t kPiece = HostStager::kPiece;

class DeviceStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TcpFabricOptions a = LoopbackOptions("a", 21, keys_);
    a.device_stager = &a_stager_;
    TcpFabricOptions b = LoopbackOptions("b", 23, keys_);
    b.device_stager = &b_stager_;
    a_ = *CreateTcpFabric(a, &a_events_);
    b_ = *CreateTcpFabric(b, &b_events_);
    absl::StatusOr<PeerId> peer = a_->Connect("b", b_->endpoints());
    ASSERT_TRUE(peer.ok()) << peer.status();
    b_on_a_ = *peer;
  }

  testing::KeyRing keys_;     // outlives the fabrics
  testing::Buffers buffers_;  // outlives the fabrics
  HostStager a_stager_, b_stager_;
  RecordingHandler a_events_, b_events_;
  std::unique_ptr<Fabric> a_, b_;
  PeerId b_on_a_ = 0;
};

TEST_F(DeviceStagingTest, GpuRegionsMoveInPiecesAndLandExactly) {
  constexpr size_t kBytes = 1 << 20;
  std::vector<uint8_t> source(kBytes), target(kBytes, 0xAB);
  std::mt19937 random(7);
  for (uint8_t& byte : source) byte = static_cast<uint8_t>(random());
  std::vector<uint8_t> expected = target;
  const auto address = [](std::vector<uint8_t>& v) {
    return reinterpret_cast<uintptr_t>(v.data());
  };
  RegionKey source_key = *a_->RegisterDeviceRegion(address(source), kBytes, 0, nullptr);
  RegionKey target_key = *b_->RegisterDeviceRegion(address(target), kBytes, 1, nullptr);
  const Extent all{0, kBytes};
  const WindowKey target_window = *b_->OpenWindow(target_key, "a", {&all, 1});
  // Sizes around the piece: less, exactly one, one byte over, several and a tail.
  const uint32_t sizes[] = {1, kPiece - 1, kPiece, kPiece + 1, 5 * kPiece + 17, 65536};
  uint64_t at = 0, moved = 0;
  int n = 0;
  for (uint32_t bytes : sizes) {
    const uint64_t from = (at * 7919) % (kBytes - bytes);
    std::memcpy(&expected[at], &source[from], bytes);
    ASSERT_TRUE(a_->PostWrite(b_on_a_, n % 2,
                              {.local_key = source_key,
                               .local_offset = from,
                               .remote_key = target_window,
                               .remote_offset = at,
                               .bytes = bytes,
                               .imm = 0,
                               .wr_id = static_cast<uint64_t>(n)})
                    .ok());
    at += bytes + 100;  // gaps stay untouched
    moved += bytes;
    ++n;
  }
  ASSERT_TRUE(a_events_.WaitForCompletions(n));
  for (const Completion& c : a_events_.completions())
    EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_TRUE(target == expected);
  EXPECT_EQ(a_stager_.log().to_host_bytes, moved);
  EXPECT_EQ(b_stager_.log().to_device_bytes, moved);
  EXPECT_EQ(b_stager_.log().last_target_gpu, 1);
  EXPECT_EQ(a_stager_.log().buffer_reused_early, 0);
  EXPECT_EQ(b_stager_.log().buffer_reused_early, 0);
}

TEST_F(DeviceStagingTest, AWriteWaitsForItsFenceAndAFailedFenceFailsIt) {
  std::vector<uint8_t>& source = buffers_.Keep(std::vector<uint8_t>(kPiece, 1));
  std::vector<uint8_t> target(kPiece, 0);
  RegionKey source_key = *a_->RegisterRegion(source.data(), source.size(), nullptr);
  RegionKey target_key = *b_->RegisterRegion(target.data(), target.size(), nullptr);
  const Extent all{0, target.size()};
  const WindowKey target_window = *b_->OpenWindow(target_key, "a", {&all, 1});
  CountingFence passes(absl::OkStatus());
  WriteOp op{.local_key = source_key,
             .local_offset = 0,
             .remote_key = target_window,
             .remote_offset = 0,
             .bytes = kPiece,
             .imm = 0,
             .wr_id = 1,
             .after = &passes};
  ASSERT_TRUE(a_->PostWrite(b_on_a_, 0, op).ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(1));
  EXPECT_TRUE(a_events_.completions()[0].status.ok());
  EXPECT_EQ(passes.waits, 1);
  EXPECT_EQ(target, source);

  CountingFence fails(absl::InternalError("the relay copy faulted"));
  op.after = &fails;
  op.wr_id = 2;
  ASSERT_TRUE(a_->PostWrite(b_on_a_, 1, op).ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(2));
  EXPECT_FALSE(a_events_.completions()[1].status.ok());
  EXPECT_EQ(fails.waits, 1);
}

// A staging copy past its bound: the write fails and goes again elsewhere, the stage
// keeps the source its copy may still read, and the other connection still carries.
TEST_F(DeviceStagingTest, ACopyPastItsBoundFailsTheWriteAndKeepsItsSource) {
  std::vector<uint8_t>& source = buffers_.Keep(std::vector<uint8_t>(2 * kPiece, 3));
  std::vector<uint8_t> target(2 * kPiece, 0);
  const auto address = [](std::vector<uint8_t>& v) {
    return reinterpret_cast<uintptr_t>(v.data());
  };
  RegionKey source_key =
      *a_->RegisterDeviceRegion(address(source), source.size(), 0, nullptr);
  RegionKey target_key = *b_->RegisterRegion(target.data(), target.size(), nullptr);
  const Extent all{0, target.size()};
  const WindowKey target_window = *b_->OpenWindow(target_key, "a", {&all, 1});
  a_stager_.log().hang_copy = 1;
  WriteOp op{.local_key = source_key,
             .local_offset = 0,
             .remote_key = target_window,
             .remote_offset = 0,
             .bytes = kPiece,
             .imm = 0,
             .wr_id = 1};
  ASSERT_TRUE(a_->PostWrite(b_on_a_, 0, op).ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(1));
  const absl::Status hung = a_events_.completions()[0].status;
  EXPECT_EQ(hung.code(), absl::StatusCode::kUnavailable) << hung;
  EXPECT_NE(hung.message().find("did not finish"), absl::string_view::npos) << hung;
  EXPECT_EQ(a_stager_.log().kept, 1);
  EXPECT_EQ(std::count(target.begin(), target.end(), 0), kPiece * 2);

  op.wr_id = 2;
  op.local_offset = op.remote_offset = kPiece;
  ASSERT_TRUE(a_->PostWrite(b_on_a_, 1, op).ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(2));
  EXPECT_TRUE(a_events_.completions()[1].status.ok())
      << a_events_.completions()[1].status;
  EXPECT_EQ(std::memcmp(target.data() + kPiece, source.data() + kPiece, kPiece), 0);
}

TEST(DeviceStagingWithoutStager, GpuRegionsAreRefused) {
  testing::KeyRing keys;
  RecordingHandler events;
  std::unique_ptr<Fabric> fabric =
      *CreateTcpFabric(LoopbackOptions("c", 25, keys), &events);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      fabric->RegisterDeviceRegion(0x1000, 4096, 0, nullptr).status()));
}

}  // namespace
}  // namespace fuselink::fabric
