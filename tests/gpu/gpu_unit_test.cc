// What the CUDA layer decides without a GPU: error codes, granule and range arithmetic,
// dma-buf page ranges, how a machine or driver without a feature is reported, and the
// bound on waiting for a copy. Runs everywhere.
#include <cstdint>
#include <functional>
#include <limits>

#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "agent/gpu/copy_bound.h"
#include "agent/gpu/dmabuf.h"
#include "agent/gpu/driver.h"
#include "agent/gpu/ipc.h"
#include "agent/gpu/vmm.h"
#include "gtest/gtest.h"

namespace fuselink::gpu {
namespace {

using absl::StatusCode;

TEST(CodeForCuResult, ChosenByWhatTheCallerShouldDo) {
  EXPECT_EQ(CodeForCuResult(cu::CUDA_SUCCESS), StatusCode::kOk);
  EXPECT_EQ(CodeForCuResult(cu::CUDA_ERROR_INVALID_VALUE), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeForCuResult(cu::CUDA_ERROR_INVALID_HANDLE), StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeForCuResult(cu::CUDA_ERROR_OUT_OF_MEMORY),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(CodeForCuResult(cu::CUDA_ERROR_NOT_READY), StatusCode::kUnavailable);
  EXPECT_EQ(CodeForCuResult(cu::CUDA_ERROR_NO_DEVICE), StatusCode::kFailedPrecondition);
  EXPECT_EQ(CodeForCuResult(cu::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(CodeForCuResult(cu::CUDA_ERROR_NOT_SUPPORTED), StatusCode::kUnimplemented);
  EXPECT_EQ(CodeForCuResult(cu::CUDA_ERROR_NOT_PERMITTED), StatusCode::kPermissionDenied);
  EXPECT_EQ(CodeForCuResult(cu::CUDA_ERROR_ILLEGAL_ADDRESS), StatusCode::kInternal);
  EXPECT_EQ(CodeForCuResult(cu::CUDA_ERROR_LAUNCH_FAILED), StatusCode::kInternal);
  EXPECT_EQ(CodeForCuResult(cu::CUDA_ERROR_UNKNOWN), StatusCode::kUnknown);
  EXPECT_EQ(CodeForCuResult(123456), StatusCode::kUnknown);
}

TEST(RoundUpToGranule, RoundsUpAndRejectsNonsense) {
  constexpr size_t kGranule = size_t{2} << 20;
  EXPECT_EQ(*RoundUpToGranule(1, kGranule), kGranule);
  EXPECT_EQ(*RoundUpToGranule(kGranule, kGranule), kGranule);
  EXPECT_EQ(*RoundUpToGranule(kGranule + 1, kGranule), 2 * kGranule);
  EXPECT_EQ(RoundUpToGranule(0, kGranule).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RoundUpToGranule(1, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      RoundUpToGranule(std::numeric_limits<size_t>::max(), kGranule).status().code(),
      StatusCode::kOutOfRange);
}

TEST(CheckSubrange, InsideOrOutOfRange) {
  EXPECT_TRUE(CheckSubrange(100, 0, 100).ok());
  EXPECT_TRUE(CheckSubrange(100, 99, 1).ok());
  EXPECT_EQ(CheckSubrange(100, 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckSubrange(100, 99, 2).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(CheckSubrange(100, 101, 1).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(CheckSubrange(100, 1, std::numeric_limits<uint64_t>::max()).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(ReasonOf(CheckSubrange(100, 99, 2)), "RANGE_OUTSIDE_ALLOCATION");
}

TEST(AlignedRange, CoversTheBytesWithWholePages) {
  constexpr uint64_t kPage = 4096;
  // Already aligned: exactly the bytes.
  PageRange range = *AlignedRange(10 * kPage, 2 * kPage, kPage);
  EXPECT_EQ(range.base, 10 * kPage);
  EXPECT_EQ(range.bytes, 2 * kPage);
  EXPECT_EQ(range.offset, 0u);
  // Unaligned start: the base moves down, the offset says by how much.
  range = *AlignedRange(10 * kPage + 123, kPage - 123, kPage);
  EXPECT_EQ(range.base, 10 * kPage);
  EXPECT_EQ(range.bytes, kPage);
  EXPECT_EQ(range.offset, 123u);
  // Unaligned end only.
  range = *AlignedRange(10 * kPage, kPage + 1, kPage);
  EXPECT_EQ(range.base, 10 * kPage);
  EXPECT_EQ(range.bytes, 2 * kPage);
  EXPECT_EQ(range.offset, 0u);
  // A few bytes straddling a page boundary take both pages.
  range = *AlignedRange(11 * kPage - 2, 4, kPage);
  EXPECT_EQ(range.base, 10 * kPage);
  EXPECT_EQ(range.bytes, 2 * kPage);
  EXPECT_EQ(range.offset, kPage - 2);
  // One byte: one page.
  range = *AlignedRange(10 * kPage + 7, 1, kPage);
  EXPECT_EQ(range.base, 10 * kPage);
  EXPECT_EQ(range.bytes, kPage);
  EXPECT_EQ(range.offset, 7u);
  // 64 KiB pages (aarch64 kernels), and a page size that is no power of two.
  range = *AlignedRange((uint64_t{1} << 20) + 5, 65536, 65536);
  EXPECT_EQ(range.base, uint64_t{1} << 20);
  EXPECT_EQ(range.bytes, 2 * 65536u);
  EXPECT_EQ(range.offset, 5u);
  range = *AlignedRange(1000, 500, 3000);
  EXPECT_EQ(range.base, 0u);
  EXPECT_EQ(range.bytes, 3000u);
  EXPECT_EQ(range.offset, 1000u);
  // The covered bytes are [base + offset, base + offset + bytes asked for).
  for (uint64_t address : {uint64_t{0}, kPage - 1, 5 * kPage + 3}) {
    for (uint64_t bytes : {uint64_t{1}, kPage, 3 * kPage + 9}) {
      range = *AlignedRange(address, bytes, kPage);
      EXPECT_EQ(range.base % kPage, 0u);
      EXPECT_EQ(range.bytes % kPage, 0u);
      EXPECT_EQ(range.base + range.offset, address);
      EXPECT_GE(range.bytes, range.offset + bytes);
      EXPECT_LT(range.bytes - (range.offset + bytes), kPage);  // the smallest
    }
  }
}

TEST(AlignedRange, RejectsNonsenseAndOverflow) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(AlignedRange(4096, 0, 4096).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AlignedRange(4096, 1, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AlignedRange(kMax, 2, 4096).status().code(), StatusCode::kOutOfRange);
  // The last byte of the address space is representable, its page end is not.
  EXPECT_EQ(AlignedRange(kMax - 10, 5, 4096).status().code(), StatusCode::kOutOfRange);
  // Ending exactly on the last page boundary that fits is fine.
  const uint64_t last_page = kMax - kMax % 4096 - 4096;
  PageRange range = *AlignedRange(last_page + 1, 4095, 4096);
  EXPECT_EQ(range.base, last_page);
  EXPECT_EQ(range.bytes, 4096u);
}

TEST(DmabufExportAvailable, DriverWithoutTheEntryPointIsUnimplemented) {
  DriverApi api{};  // an old driver: cuMemGetHandleForAddressRange not resolved
  const absl::Status status = DmabufExportAvailable(api);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(ReasonOf(status), "NO_DMABUF_EXPORT");
  EXPECT_NE(status.message().find("cuMemGetHandleForAddressRange"),
            absl::string_view::npos)
      << status;
  api.cuMemGetHandleForAddressRange = [](void*, cu::CUdeviceptr, size_t,
                                         cu::CUmemRangeHandleType,
                                         unsigned long long) { return cu::CUDA_SUCCESS; };
  EXPECT_TRUE(DmabufExportAvailable(api).ok());
}

TEST(Driver, MissingLibraryIsFailedPreconditionWithReason) {
  auto driver = Driver::LoadFrom("libfuselink-no-such-driver.so.1");
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(driver.status().message().find("no NVIDIA driver: "
                                           "libfuselink-no-such-driver.so.1 not found"),
            absl::string_view::npos)
      << driver.status();
  EXPECT_EQ(ReasonOf(driver.status()), "NO_CUDA_DRIVER");
}

TEST(Driver, LibraryWithoutEntryPointsIsFailedPrecondition) {
  auto driver = Driver::LoadFrom("libc.so.6");
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(driver.status().message().find("lacks cuInit"), absl::string_view::npos)
      << driver.status();
}

TEST(Driver, LoadIsCachedAndSaysWhyNot) {
  auto first = Driver::Load();
  auto second = Driver::Load();
  ASSERT_EQ(first.ok(), second.ok());
  if (first.ok()) {
    EXPECT_EQ(*first, *second);
    EXPECT_GT((*first)->version(), 0);
  } else {
    EXPECT_EQ(first.status().code(), StatusCode::kFailedPrecondition) << first.status();
    EXPECT_EQ(first.status(), second.status());
    std::printf("no GPU here: %s\n", first.status().ToString().c_str());
  }
}

// The polls CopyBound::Wait makes: done after `polls`, never (-1), or an error.
class Polls {
 public:
  explicit Polls(int polls, absl::Status error = absl::OkStatus())
      : polls_(polls), error_(std::move(error)) {}
  absl::StatusOr<bool> operator()() {
    ++made;
    if (!error_.ok()) return error_;
    return polls_ >= 0 && made >= polls_;
  }
  int made = 0;

 private:
  const int polls_;
  const absl::Status error_;
};

TEST(CopyBound, AnEndedCopyIsOkAndUncounted) {
  CopyBound bound(absl::Seconds(10));
  Polls polls(1);
  EXPECT_TRUE(bound.Wait(std::ref(polls), "a copy").ok());
  EXPECT_EQ(polls.made, 1);
  EXPECT_EQ(bound.timeouts(), 0u);
}

TEST(CopyBound, ACopyThatEndsAfterTheSpinIsWaitedFor) {
  CopyBound bound(absl::Seconds(10));
  const absl::Time start = absl::Now();
  const absl::Time ends = start + 20 * CopyBound::kSpin;  // well into the naps
  const auto done = [ends]() -> absl::StatusOr<bool> { return absl::Now() >= ends; };
  EXPECT_TRUE(bound.Wait(done, "a copy").ok());
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, 20 * CopyBound::kSpin);
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(bound.timeouts(), 0u);
}

TEST(CopyBound, AFailedCopyIsItsError) {
  CopyBound bound(absl::Seconds(10));
  Polls polls(-1, absl::InternalError("CUDA_ERROR_ILLEGAL_ADDRESS"));
  EXPECT_EQ(bound.Wait(std::ref(polls), "a copy").code(), StatusCode::kInternal);
  EXPECT_EQ(bound.timeouts(), 0u);
}

TEST(CopyBound, ACopyThatNeverEndsIsDeadlineExceededWithinItsBound) {
  CopyBound bound(absl::Milliseconds(50));
  Polls polls(-1);
  const absl::Time start = absl::Now();
  const absl::Status waited = bound.Wait(std::ref(polls), "a staging copy on GPU 3");
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(waited.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ReasonOf(waited), "GPU_COPY_TIMEOUT");
  EXPECT_NE(waited.message().find("a staging copy on GPU 3"), absl::string_view::npos);
  EXPECT_GE(took, absl::Milliseconds(50));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(bound.timeouts(), 1u);
}

}  // namespace
}  // namespace fuselink::gpu
