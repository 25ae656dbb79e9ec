// Driver load, device query, primary contexts and the device guard, on a real GPU.
#include "agent/gpu/device.h"

#include <cstdio>

#include "tests/gpu/gpu_test_util.h"

namespace fuselink::gpu::testing {
namespace {

using DeviceTest = GpuTest;

TEST_F(DeviceTest, QueriesEveryDevice) {
  EXPECT_GT(driver_->version(), 0);
  auto count = DeviceCount(*driver_);
  ASSERT_TRUE(count.ok()) << count.status();
  ASSERT_GE(*count, 1);
  for (int i = 0; i < *count; ++i) {
    auto info = QueryDevice(*driver_, i);
    ASSERT_TRUE(info.ok()) << info.status();
    std::printf(
        "GPU %d: %s, %s, sm_%d%d, %d SMs, %llu MiB, vmm %d, posix fd %d, "
        "gpudirect rdma %d (vmm %d), dma-buf %d, driver %d\n",
        i, info->name.c_str(), info->pci_bus_id.c_str(), info->compute_major,
        info->compute_minor, info->multiprocessors,
        static_cast<unsigned long long>(info->total_bytes >> 20), info->vmm,
        info->posix_fd_handles, info->gpudirect_rdma, info->gpudirect_rdma_vmm,
        info->dma_buf, driver_->version());
    EXPECT_FALSE(info->name.empty());
    EXPECT_EQ(info->pci_bus_id.size(), 12u) << info->pci_bus_id;  // "0000:19:00.0"
    EXPECT_GT(info->multiprocessors, 0);
    EXPECT_GT(info->total_bytes, 0u);
    EXPECT_TRUE(info->unified_addressing);
    for (int j = 0; j < *count; ++j) {
      if (i == j) continue;
      auto can = CanAccessPeer(*driver_, i, j);
      ASSERT_TRUE(can.ok()) << can.status();
      std::printf("  P2P %d -> %d: %d\n", i, j, *can);
    }
  }
  EXPECT_EQ(QueryDevice(*driver_, *count).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto memory = DeviceMemoryInfo(*context_);
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_GT(memory->free_bytes, 0u);
  EXPECT_LE(memory->free_bytes, memory->total_bytes);
}

TEST_F(DeviceTest, GuardMakesCurrentAndRestoresPrevious) {
  const DriverApi& api = driver_->api();
  auto current = [&] {
    cu::CUcontext ctx = nullptr;
    EXPECT_EQ(api.cuCtxGetCurrent(&ctx), cu::CUDA_SUCCESS);
    return ctx;
  };
  ASSERT_EQ(api.cuCtxSetCurrent(nullptr), cu::CUDA_SUCCESS);
  ASSERT_EQ(current(), nullptr);
  {
    DeviceGuard guard(*context_);
    FL_ASSERT_OK(guard.status());
    EXPECT_EQ(current(), context_->get());
    {
      DeviceGuard nested(*context_);  // already current: nothing to switch
      FL_ASSERT_OK(nested.status());
      EXPECT_EQ(current(), context_->get());
    }
    EXPECT_EQ(current(), context_->get());
  }
  EXPECT_EQ(current(), nullptr);
}

TEST_F(DeviceTest, PrimaryContextIsSharedAndRefcounted) {
  auto again = PrimaryContext::Retain(*driver_, 0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), context_->get());
  FL_ASSERT_OK(again->Release());
  FL_ASSERT_OK(again->Release());  // idempotent
  // Ours is still retained and usable.
  auto memory = DeviceMemoryInfo(*context_);
  EXPECT_TRUE(memory.ok()) << memory.status();
}

}  // namespace
}  // namespace fuselink::gpu::testing
