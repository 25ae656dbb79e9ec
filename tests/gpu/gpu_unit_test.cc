// What the CUDA layer decides without a GPU: error codes, granule and range arithmetic,
// and how a machine without a driver is reported. Runs everywhere.
#include <cstdint>
#include <limits>

#include "agent/common/status_macros.h"
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

}  // namespace
}  // namespace fuselink::gpu
