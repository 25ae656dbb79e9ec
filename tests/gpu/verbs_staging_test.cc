// The verbs fabric's staging path on real GPUs with a loopback stand-in for the NIC (no
// machine here has an RDMA device next to a GPU): bounce slots of real pinned memory
// filled from GPU memory by the CUDA stager, "sent" by a memcpy into a window's host
// shadow, and landed in GPU memory, across NVLink when a second GPU is lent. Also what
// the path probe finds here, and (printed, not asserted) the staging rates against one
// PCIe copy of the same bytes.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "agent/common/status_macros.h"
#include "agent/fabric/verbs/host_shadow.h"
#include "agent/fabric/verbs/staging.h"
#include "agent/gpu/copy_bound.h"
#include "agent/gpu/memory.h"
#include "agent/gpu/runtime.h"
#include "agent/gpu/stream_set.h"
#include "agent/relay/device_stager.h"
#include "tests/gpu/gpu_test_util.h"

namespace fuselink::gpu::testing {
namespace {

using fabric::Extent;
using fabric::HostShadow;
using fabric::verbs::BouncePool;

constexpr uint32_t kSlotBytes = 4 << 20;
constexpr uint64_t kPage = 4096;

// No NIC: a slot needs no registration to be read by a memcpy.
BouncePool::Registrar Loopback() {
  return [](uint8_t*, uint64_t) -> absl::StatusOr<fabric::verbs::MemoryRegion> {
    return fabric::verbs::MemoryRegion();
  };
}

class VerbsStagingTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    absl::StatusOr<std::unique_ptr<Runtime>> runtime = Runtime::Open(8);
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    runtime_ = *std::move(runtime);
    // NIC 0 next to GPU 0: bytes for another GPU land there and cross NVLink.
    stager_ = std::make_unique<relay::CudaDeviceStager>(runtime_.get(), &bound_,
                                                        std::vector<int>{0}, 1 << 20);
  }
  int target_gpu() const { return runtime_->count() > 1 ? 1 : 0; }

  std::unique_ptr<Runtime> runtime_;
  CopyBound bound_{absl::Seconds(10)};
  std::unique_ptr<relay::CudaDeviceStager> stager_;
};

TEST_F(VerbsStagingTest, StagedOutAndLandedBytesAreExact) {
  constexpr size_t kBytes = 16 << 20;
  absl::StatusOr<DeviceBuffer> source =
      DeviceBuffer::Allocate(runtime_->context(0), kBytes);
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<DeviceBuffer> target =
      DeviceBuffer::Allocate(runtime_->context(target_gpu()), kBytes);
  ASSERT_TRUE(target.ok()) << target.status();
  const uint64_t seed = RandomSeed();
  const std::vector<uint8_t> bytes = Pattern(kBytes, seed);
  FL_ASSERT_OK(WriteDevice(*stream_, source->ptr(), bytes));
  FL_ASSERT_OK(WriteDevice(*stream_, target->ptr(), std::vector<uint8_t>(kBytes, 0)));

  // A window of four extents with gaps, odd sizes and odd offsets.
  const std::vector<Extent> extents = {
      {1, 3 << 20}, {(4 << 20) + 77, kSlotBytes}, {9 << 20, 1}, {(10 << 20) + 5, 5000}};
  absl::StatusOr<std::shared_ptr<const HostShadow>> shadow =
      HostShadow::Create(extents, target->ptr() % kPage, kPage, /*staged_nics=*/1,
                         [&](uint64_t n) { return stager_->AllocatePinned(0, n); });
  ASSERT_TRUE(shadow.ok()) << shadow.status();
  absl::StatusOr<std::shared_ptr<BouncePool>> pool =
      BouncePool::Create(*stager_, 0, 2, kSlotBytes, Loopback());
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<std::unique_ptr<fabric::DeviceStage>> out = stager_->NewStage(0);
  absl::StatusOr<std::unique_ptr<fabric::DeviceStage>> in = stager_->NewStage(0);
  ASSERT_TRUE(out.ok() && in.ok());

  std::vector<uint8_t> expected(kBytes, 0);
  for (const Extent& e : extents) {
    const uint64_t from = (e.offset * 7) % (kBytes - e.bytes);  // elsewhere in the source
    std::memcpy(&expected[e.offset], &bytes[from], e.bytes);
    absl::StatusOr<std::shared_ptr<const BouncePool::Slot>> slot =
        fabric::verbs::StageOut(**pool, **out, 0, source->ptr() + from,
                                static_cast<uint32_t>(e.bytes));
    ASSERT_TRUE(slot.ok()) << slot.status();
    uint8_t* landed = (*shadow)->At(e.offset, e.bytes);
    ASSERT_NE(landed, nullptr);
    std::memcpy(landed, (*slot)->data, e.bytes);  // the NIC's RDMA write
    slot->reset();
    FL_ASSERT_OK((*in)->StartToDeviceFrom(target_gpu(), target->ptr() + e.offset, landed,
                                          static_cast<uint32_t>(e.bytes)));
    FL_ASSERT_OK((*in)->Wait());
  }
  EXPECT_EQ((*pool)->free_slots(), 2u);
  absl::StatusOr<std::vector<uint8_t>> read = ReadDevice(*stream_, target->ptr(), kBytes);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(*read == expected) << "GPU " << target_gpu() << " holds other bytes";
  std::printf("staging: GPU 0 -> slot -> shadow -> GPU %d, %zu extents exact\n",
              target_gpu(), extents.size());
}

TEST_F(VerbsStagingTest, AFaultedCopyFailsAndGivesItsSlotBack) {
  absl::StatusOr<std::shared_ptr<BouncePool>> pool =
      BouncePool::Create(*stager_, 0, 1, kSlotBytes, Loopback());
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<std::unique_ptr<fabric::DeviceStage>> stage = stager_->NewStage(0);
  ASSERT_TRUE(stage.ok()) << stage.status();
  absl::StatusOr<DeviceBuffer> freed =
      DeviceBuffer::Allocate(runtime_->context(0), 1 << 20);
  ASSERT_TRUE(freed.ok());
  const cu::CUdeviceptr gone = freed->ptr();
  FL_ASSERT_OK(freed->Free());
  absl::StatusOr<std::shared_ptr<const BouncePool::Slot>> failed =
      fabric::verbs::StageOut(**pool, **stage, 0, gone, 4096);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  EXPECT_EQ((*pool)->free_slots(), 1u);
  // The stage and the pool go on.
  absl::StatusOr<DeviceBuffer> live = DeviceBuffer::Allocate(runtime_->context(0), 4096);
  ASSERT_TRUE(live.ok());
  FL_ASSERT_OK(WriteDevice(*stream_, live->ptr(), Pattern(4096, 9)));
  absl::StatusOr<std::shared_ptr<const BouncePool::Slot>> next =
      fabric::verbs::StageOut(**pool, **stage, 0, live->ptr(), 4096);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(std::memcmp((*next)->data, Pattern(4096, 9).data(), 4096), 0);
}

// Here the driver exports dma-bufs, but there is no RDMA device to register them with:
// the probe finds staging, which is what the agent's TCP fabric does too.
TEST_F(VerbsStagingTest, WithoutAnRdmaDeviceThePathIsStaged) {
  uint64_t address = 0;
  absl::StatusOr<std::shared_ptr<const void>> probe =
      stager_->AllocateProbe(0, 2 << 20, &address);
  ASSERT_TRUE(probe.ok()) << probe.status();
  absl::StatusOr<fabric::DmabufRange> exported =
      stager_->ExportDmabuf(0, address, 2 << 20);
  std::printf("dma-buf export of the probe: %s\n", exported.status().ToString().c_str());
  const fabric::verbs::GpuPathProbe found = fabric::verbs::ProbeGpuPath(
      stager_.get(), 0, nullptr, fabric::verbs::PeerMemoryLoaded("/sys"));
  EXPECT_EQ(fabric::verbs::ChooseGpuPath(found), fabric::verbs::GpuPath::kStaged);
  std::printf("path with no RDMA device: %s; peer-memory module %s\n",
              std::string(fabric::verbs::GpuPathName(fabric::verbs::ChooseGpuPath(found)))
                  .c_str(),
              fabric::verbs::PeerMemoryLoaded("/sys") ? "loaded" : "absent");
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Not a pass/fail test: the staging rates beside one PCIe copy of the same bytes, in
// one run (docs/benchmarks.md). FUSELINK_STAGING_BENCH_MIB sizes it (default 1024).
TEST_F(VerbsStagingTest, BenchStagingAgainstOnePcieCopy) {
  const char* env = std::getenv("FUSELINK_STAGING_BENCH_MIB");
  const size_t total = size_t{env != nullptr ? std::strtoul(env, nullptr, 10) : 1024}
                       << 20;
  absl::StatusOr<DeviceBuffer> device =
      DeviceBuffer::Allocate(runtime_->context(0), total);
  ASSERT_TRUE(device.ok()) << device.status();
  absl::StatusOr<std::shared_ptr<uint8_t>> host = stager_->AllocatePinned(0, total);
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<std::shared_ptr<BouncePool>> pool =
      BouncePool::Create(*stager_, 0, 8, kSlotBytes, Loopback());
  ASSERT_TRUE(pool.ok());
  absl::StatusOr<std::unique_ptr<fabric::DeviceStage>> stage = stager_->NewStage(0);
  ASSERT_TRUE(stage.ok());
  for (int round = 0; round < 3; ++round) {
    auto start = std::chrono::steady_clock::now();
    FL_ASSERT_OK((*stage)->StartToHostAt(
        0, device->ptr(), host->get(),
        static_cast<uint32_t>(std::min<size_t>(total, uint32_t{1} << 31))));
    FL_ASSERT_OK((*stage)->Wait());
    const double one_copy = Seconds(start);
    start = std::chrono::steady_clock::now();
    for (size_t at = 0; at < total; at += kSlotBytes) {
      absl::StatusOr<std::shared_ptr<const BouncePool::Slot>> slot =
          fabric::verbs::StageOut(**pool, **stage, 0, device->ptr() + at, kSlotBytes);
      ASSERT_TRUE(slot.ok()) << slot.status();
    }
    const double staged_out = Seconds(start);
    start = std::chrono::steady_clock::now();
    for (size_t at = 0; at < total; at += kSlotBytes) {
      FL_ASSERT_OK((*stage)->StartToDeviceFrom(0, device->ptr() + at, host->get() + at,
                                               kSlotBytes));
      FL_ASSERT_OK((*stage)->Wait());
    }
    const double landed = Seconds(start);
    const double gb = static_cast<double>(total) / 1e9;
    std::printf(
        "bench: staging round %d, %zu MiB in 4 MiB writes: one D2H copy %.1f GB/s, "
        "staged out %.1f GB/s (%.2fx), landed %.1f GB/s (%.2fx)\n",
        round, total >> 20, gb / one_copy, gb / staged_out, one_copy / staged_out,
        gb / landed, one_copy / landed);
  }
}

// Not a pass/fail test: what a window's host shadow costs to pin when the target opens
// the window (AllocatePinned is cuMemHostAlloc), by size, each freed before the next.
TEST_F(VerbsStagingTest, BenchPinningAShadow) {
  for (uint64_t mib : {4, 64, 256, 1024}) {
    for (int round = 0; round < 3; ++round) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<std::shared_ptr<uint8_t>> shadow =
          stager_->AllocatePinned(0, mib << 20);
      const double pinned = Seconds(start);
      ASSERT_TRUE(shadow.ok()) << shadow.status();
      const auto freeing = std::chrono::steady_clock::now();
      shadow->reset();
      std::printf(
          "bench: shadow of %4llu MiB, round %d: pinned in %.2f ms, freed in %.2f ms\n",
          static_cast<unsigned long long>(mib), round, pinned * 1e3,
          Seconds(freeing) * 1e3);
    }
  }
}

// A copy past its bound, on a real GPU: a 1 us bound under a 256 MiB copy, which
// cannot end within it. The stage is spent, and what it keeps goes back only once
// the GPU has finished the copy.
TEST_F(VerbsStagingTest, ACopyPastItsBoundSpendsTheStageAndKeepsItsMemoryUntilItEnds) {
  constexpr uint64_t kBytes = uint64_t{256} << 20;
  absl::StatusOr<DeviceBuffer> source =
      DeviceBuffer::Allocate(runtime_->context(0), kBytes);
  ASSERT_TRUE(source.ok()) << source.status();
  FL_ASSERT_OK(stream_->Fill(source->ptr(), 0x5a, kBytes));
  FL_ASSERT_OK(stream_->Synchronize());
  CopyBound tight(absl::Microseconds(1));
  relay::CudaDeviceStager stager(runtime_.get(), &tight, std::vector<int>{0}, 1 << 20);
  absl::StatusOr<std::shared_ptr<uint8_t>> host = stager.AllocatePinned(0, kBytes);
  ASSERT_TRUE(host.ok()) << host.status();
  absl::StatusOr<std::unique_ptr<fabric::DeviceStage>> stage = stager.NewStage(0);
  ASSERT_TRUE(stage.ok()) << stage.status();

  FL_ASSERT_OK((*stage)->StartToHostAt(0, source->ptr(), host->get(), kBytes));
  const absl::Status waited = (*stage)->Wait();
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_EQ(ReasonOf(waited), "GPU_COPY_TIMEOUT");
  EXPECT_EQ(tight.timeouts(), 1u);
  const absl::Status refused = (*stage)->StartToHostAt(0, source->ptr(), host->get(), 64);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(ReasonOf(refused), "GPU_COPY_TIMEOUT");

  (*stage)->KeepWhileBusy(*host);
  host->reset();
  const uint64_t kept_before = kept_bytes();
  stage->reset();  // most likely while the copy still runs: then it is kept
  std::printf("kept when the stage went: %llu bytes\n",
              static_cast<unsigned long long>(kept_bytes() - kept_before));
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (kept_bytes() > kept_before && absl::Now() < give_up) {
    FreeIdleKept();
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(kept_bytes(), kept_before);
}

// StageOut past the bound: the write fails UNAVAILABLE, and the bounce slot the copy
// may still write stays out of the pool until the copy has ended.
TEST_F(VerbsStagingTest, AStagedWritePastItsBoundKeepsItsBounceSlotUntilTheCopyEnds) {
  constexpr uint32_t kBytes = 256u << 20;
  absl::StatusOr<DeviceBuffer> source =
      DeviceBuffer::Allocate(runtime_->context(0), kBytes);
  ASSERT_TRUE(source.ok()) << source.status();
  CopyBound tight(absl::Microseconds(1));
  relay::CudaDeviceStager stager(runtime_.get(), &tight, std::vector<int>{0}, 1 << 20);
  absl::StatusOr<std::shared_ptr<BouncePool>> pool =
      BouncePool::Create(stager, 0, 1, kBytes, Loopback());
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<std::unique_ptr<fabric::DeviceStage>> stage = stager.NewStage(0);
  ASSERT_TRUE(stage.ok()) << stage.status();

  const absl::Status staged =
      fabric::verbs::StageOut(**pool, **stage, 0, source->ptr(), kBytes).status();
  EXPECT_EQ(staged.code(), absl::StatusCode::kUnavailable) << staged;
  EXPECT_EQ((*pool)->free_slots(), 0u);  // kept by the spent stage
  stage->reset();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while ((*pool)->free_slots() == 0 && absl::Now() < give_up) {
    FreeIdleKept();
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ((*pool)->free_slots(), 1u);
}

}  // namespace
}  // namespace fuselink::gpu::testing
