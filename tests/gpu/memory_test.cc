// Device allocations, pinned and registered host memory, async copies and the copy
// kernel, each checked on random bytes.
#include "agent/gpu/memory.h"

#include <cstdlib>
#include <cstring>

#include "agent/gpu/copy_kernel.h"
#include "tests/gpu/gpu_test_util.h"

namespace fuselink::gpu::testing {
namespace {

using MemoryTest = GpuTest;

constexpr size_t kBytes = (size_t{64} << 20) + 123;  // not a multiple of anything

TEST_F(MemoryTest, PinnedHostToDeviceToDeviceToHostRoundTrip) {
  auto source = PinnedHostBuffer::Allocate(*context_, kBytes);
  auto target = PinnedHostBuffer::Allocate(*context_, kBytes);
  auto first = DeviceBuffer::Allocate(*context_, kBytes);
  auto second = DeviceBuffer::Allocate(*context_, kBytes);
  ASSERT_TRUE(source.ok() && target.ok() && first.ok() && second.ok())
      << source.status() << target.status() << first.status() << second.status();
  const uint64_t seed = RandomSeed();
  auto* in = static_cast<uint8_t*>(source->data());
  auto* out = static_cast<uint8_t*>(target->data());
  FillPattern(in, kBytes, seed);
  std::memset(out, 0xA5, kBytes);
  FL_ASSERT_OK(stream_->Fill(second->ptr(), 0x5A, kBytes));
  FL_ASSERT_OK(stream_->CopyHostToDevice(first->ptr(), in, kBytes));
  FL_ASSERT_OK(stream_->CopyDeviceToDevice(second->ptr(), first->ptr(), kBytes));
  FL_ASSERT_OK(stream_->CopyDeviceToHost(out, second->ptr(), kBytes));
  FL_ASSERT_OK(stream_->Synchronize());
  EXPECT_EQ(std::memcmp(in, out, kBytes), 0);
  FL_ASSERT_OK(first->Free());
  FL_ASSERT_OK(first->Free());  // idempotent
}

TEST_F(MemoryTest, RegisteredHostMemoryRoundTrip) {
  constexpr size_t kPage = 4096;
  constexpr size_t kRegistered = size_t{8} << 20;
  void* raw = std::aligned_alloc(kPage, kRegistered);
  ASSERT_NE(raw, nullptr);
  {
    auto registration = HostRegistration::Register(*context_, raw, kRegistered);
    ASSERT_TRUE(registration.ok()) << registration.status();
    auto device = DeviceBuffer::Allocate(*context_, kRegistered);
    ASSERT_TRUE(device.ok()) << device.status();
    const std::vector<uint8_t> expected = Pattern(kRegistered, RandomSeed());
    std::memcpy(raw, expected.data(), kRegistered);
    FL_ASSERT_OK(stream_->CopyHostToDevice(device->ptr(), raw, kRegistered));
    FL_ASSERT_OK(stream_->Synchronize());
    std::memset(raw, 0, kRegistered);
    FL_ASSERT_OK(stream_->CopyDeviceToHost(raw, device->ptr(), kRegistered));
    FL_ASSERT_OK(stream_->Synchronize());
    EXPECT_EQ(std::memcmp(raw, expected.data(), kRegistered), 0);
    // Registering the same pages twice is the caller's mistake.
    EXPECT_EQ(HostRegistration::Register(*context_, raw, kRegistered).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  std::free(raw);
}

TEST_F(MemoryTest, CopyKernelCopiesEveryByte) {
  constexpr size_t kKernelBytes = (size_t{32} << 20) + 16 * 7;
  auto kernel = CopyKernel::Load(*context_);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  auto source = DeviceBuffer::Allocate(*context_, kKernelBytes);
  auto target = DeviceBuffer::Allocate(*context_, kKernelBytes);
  ASSERT_TRUE(source.ok() && target.ok()) << source.status() << target.status();
  const std::vector<uint8_t> expected = Pattern(kKernelBytes, RandomSeed());
  FL_ASSERT_OK(WriteDevice(*stream_, source->ptr(), expected));
  FL_ASSERT_OK(stream_->Fill(target->ptr(), 0xEE, kKernelBytes));
  FL_ASSERT_OK(kernel->Launch(*stream_, target->ptr(), source->ptr(), kKernelBytes));
  auto seen = ReadDevice(*stream_, target->ptr(), kKernelBytes);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_TRUE(*seen == expected);
  EXPECT_EQ(kernel->Launch(*stream_, target->ptr() + 8, source->ptr(), 16).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kernel->Launch(*stream_, target->ptr(), source->ptr(), 17).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(MemoryTest, BadSizesAreInvalidArgument) {
  EXPECT_EQ(DeviceBuffer::Allocate(*context_, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PinnedHostBuffer::Allocate(*context_, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // More than any GPU has: the driver's out-of-memory, as RESOURCE_EXHAUSTED.
  auto huge = DeviceBuffer::Allocate(*context_, size_t{1} << 50);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_NE(huge.status().message().find("cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY"),
            absl::string_view::npos)
      << huge.status();
}

}  // namespace
}  // namespace fuselink::gpu::testing
