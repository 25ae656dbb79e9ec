// GPU memory exported as dma-buf fds (what ibv_reg_dmabuf_mr takes): cuMemAlloc memory
// at an unaligned sub-range, VMM memory with and without the GPUDirect RDMA flag, ranges
// CUDA does not own, and no descriptor left open. The fds are only inspected (fstat,
// lseek); mapping them on the CPU is not something dma-bufs of GPU memory promise.
#include "agent/gpu/dmabuf.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "agent/common/status_macros.h"
#include "agent/gpu/memory.h"
#include "agent/gpu/vmm.h"
#include "tests/gpu/gpu_test_util.h"

namespace fuselink::gpu::testing {
namespace {

using absl::StatusCode;

constexpr size_t kMiB = size_t{1} << 20;

// Entries of /proc/self/fd, the directory stream's own descriptor included (the same
// one each call).
size_t OpenFdCount() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  size_t count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

// A refusal is a status the caller can act on, naming the call: never UNKNOWN, never a
// dead context.
void ExpectCleanRefusal(const absl::Status& status) {
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(status.code() == StatusCode::kInvalidArgument ||
              status.code() == StatusCode::kNotFound ||
              status.code() == StatusCode::kUnimplemented ||
              status.code() == StatusCode::kFailedPrecondition ||
              status.code() == StatusCode::kPermissionDenied)
      << status;
  EXPECT_NE(status.message().find("cuMemGetHandleForAddressRange"),
            absl::string_view::npos)
      << status;
}

class DmabufTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (absl::Status available = DmabufExportAvailable(driver_->api()); !available.ok()) {
      GTEST_SKIP() << available.message();
    }
    auto supported = DmabufSupported(*context_);
    ASSERT_TRUE(supported.ok()) << supported.status();
    if (!*supported) {
      GTEST_SKIP() << "GPU 0 reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0";
    }
    page_bytes_ = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  }

  // The fd is a live descriptor of a dma-buf covering the range it was exported for.
  void ExpectDmabuf(const DmabufRange& range, uint64_t address, uint64_t bytes) {
    const PageRange expected = *AlignedRange(address, bytes, page_bytes_);
    EXPECT_EQ(range.offset, expected.offset);
    EXPECT_EQ(range.offset, address % page_bytes_);
    EXPECT_EQ(range.bytes, bytes);
    EXPECT_EQ(range.dmabuf_bytes, expected.bytes);
    ASSERT_TRUE(range.fd.valid());
    struct stat st {};
    ASSERT_EQ(fstat(range.fd.get(), &st), 0) << std::strerror(errno);
    const off_t size = lseek(range.fd.get(), 0, SEEK_END);
    ASSERT_GE(size, 0) << "lseek(SEEK_END) on a dma-buf: " << std::strerror(errno);
    EXPECT_GE(static_cast<uint64_t>(size), range.offset + range.bytes);
    std::printf("dma-buf fd %d: %lld bytes (asked %llu at offset %llu, exported %llu)\n",
                range.fd.get(), static_cast<long long>(size),
                static_cast<unsigned long long>(bytes),
                static_cast<unsigned long long>(range.offset),
                static_cast<unsigned long long>(range.dmabuf_bytes));
  }

  uint64_t page_bytes_ = 0;
};

TEST_F(DmabufTest, DeviceMemorySubrangeExportsItsPages) {
  auto buffer = DeviceBuffer::Allocate(*context_, 8 * kMiB);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  // Starts 123 bytes into a page and ends 130 bytes into another.
  const uint64_t address = buffer->ptr() + 3 * page_bytes_ + 123;
  const uint64_t bytes = kMiB + 7;
  auto range = ExportDmabuf(*context_, address, bytes);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->offset, 123u);
  ASSERT_NO_FATAL_FAILURE(ExpectDmabuf(*range, address, bytes));

  // The whole allocation, from its (page-aligned) base.
  auto whole = ExportDmabuf(*context_, buffer->ptr(), buffer->size_bytes());
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_NO_FATAL_FAILURE(ExpectDmabuf(*whole, buffer->ptr(), buffer->size_bytes()));
  EXPECT_NE(whole->fd.get(), range->fd.get());
}

TEST_F(DmabufTest, VmmMemoryWithAndWithoutTheRdmaFlag) {
  auto info = QueryDevice(*driver_, 0);
  ASSERT_TRUE(info.ok()) << info.status();
  if (!info->vmm || !info->posix_fd_handles) {
    GTEST_SKIP() << "GPU 0 lacks VMM or POSIX fd handles";
  }
  for (bool rdma : {false, true}) {
    SCOPED_TRACE(rdma ? "gpuDirectRDMACapable requested" : "plain VMM memory");
    auto buffer = VmmBuffer::Create(*context_, 4 * kMiB, {}, {.gpudirect_rdma = rdma});
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_EQ(buffer->gpudirect_rdma(), rdma && info->gpudirect_rdma_vmm);
    const uint64_t address = buffer->ptr() + page_bytes_ + 5;
    const uint64_t bytes = 2 * kMiB;
    auto range = ExportDmabuf(*context_, address, bytes);
    std::printf("dma-buf of VMM memory, gpuDirectRDMACapable %s (requested %d): %s\n",
                buffer->gpudirect_rdma() ? "set" : "unset", rdma,
                range.ok() ? "exported" : range.status().ToString().c_str());
    if (range.ok()) {
      ASSERT_NO_FATAL_FAILURE(ExpectDmabuf(*range, address, bytes));
    } else {
      ExpectCleanRefusal(range.status());
    }
    // The memory the verbs transport registers: it must export where the device has
    // the flag.
    if (buffer->gpudirect_rdma()) {
      EXPECT_TRUE(range.ok()) << range.status();
    }
  }
}

TEST_F(DmabufTest, RangesCudaDoesNotOwnAreRefused) {
  const size_t before = OpenFdCount();
  // Pageable host memory.
  void* host = std::aligned_alloc(page_bytes_, kMiB);
  ASSERT_NE(host, nullptr);
  auto range = ExportDmabuf(*context_, reinterpret_cast<uintptr_t>(host), kMiB);
  std::printf("dma-buf of host memory: %s\n", range.status().ToString().c_str());
  ExpectCleanRefusal(range.status());
  std::free(host);

  // Device memory already freed.
  auto buffer = DeviceBuffer::Allocate(*context_, 4 * kMiB);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const cu::CUdeviceptr freed = buffer->ptr();
  FL_ASSERT_OK(buffer->Free());
  range = ExportDmabuf(*context_, freed, kMiB);
  std::printf("dma-buf of freed memory: %s\n", range.status().ToString().c_str());
  ExpectCleanRefusal(range.status());

  // Nothing to export: refused before the driver is asked.
  EXPECT_EQ(ExportDmabuf(*context_, freed, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenFdCount(), before);
}

TEST_F(DmabufTest, EachFdClosesWithItsRange) {
  auto buffer = DeviceBuffer::Allocate(*context_, 4 * kMiB);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  {  // The driver may open descriptors of its own on first use; not ours to count.
    auto warm_up = ExportDmabuf(*context_, buffer->ptr(), page_bytes_);
    ASSERT_TRUE(warm_up.ok()) << warm_up.status();
  }
  const size_t before = OpenFdCount();
  for (uint64_t i = 0; i < 16; ++i) {
    auto range = ExportDmabuf(*context_, buffer->ptr() + i * page_bytes_ + i, kMiB);
    ASSERT_TRUE(range.ok()) << range.status();
    EXPECT_EQ(OpenFdCount(), before + 1);
  }
  EXPECT_EQ(OpenFdCount(), before);
}

// Where the GPU cannot export, the export says so instead of asking the driver.
using DmabufUnsupportedTest = GpuTest;

TEST_F(DmabufUnsupportedTest, ExportIsUnimplemented) {
  auto supported = DmabufSupported(*context_);
  ASSERT_TRUE(supported.ok()) << supported.status();
  if (*supported) GTEST_SKIP() << "GPU 0 supports dma-buf: nothing refused here";
  auto range = ExportDmabuf(*context_, 1 << 20, 4096);
  EXPECT_EQ(range.status().code(), StatusCode::kUnimplemented) << range.status();
  const std::string reason = ReasonOf(range.status());
  EXPECT_TRUE(reason == "NO_DMABUF" || reason == "NO_DMABUF_EXPORT") << range.status();
}

}  // namespace
}  // namespace fuselink::gpu::testing
