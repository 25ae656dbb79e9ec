#include "services/grpc/request_checks.h"

#include <cstdint>
#include <limits>

#include "agent/common/status_macros.h"
#include "gtest/gtest.h"

namespace fuselink::services {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

v1::TransferRequest WithDeadline(int64_t seconds, int32_t nanos) {
  v1::TransferRequest request;
  request.mutable_deadline()->set_seconds(seconds);
  request.mutable_deadline()->set_nanos(nanos);
  return request;
}

void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::string& reason) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_EQ(ReasonOf(status), reason) << status;
}

TEST(CheckDeadline, NoneOrAFutureOneIsFine) {
  EXPECT_TRUE(CheckDeadline(v1::TransferRequest(), kNow).ok());
  EXPECT_TRUE(CheckDeadline(WithDeadline(1'800'000'001, 0), kNow).ok());
  EXPECT_TRUE(CheckDeadline(WithDeadline(1'800'000'000, 1), kNow).ok());
  // Past any representable time: a deadline that never comes.
  EXPECT_TRUE(
      CheckDeadline(WithDeadline(std::numeric_limits<int64_t>::max(), 999'999'999), kNow)
          .ok());
}

TEST(CheckDeadline, APastOneHoweverFarIsExceeded) {
  for (auto [seconds, nanos] : {std::pair<int64_t, int32_t>{1'800'000'000, 0},
                                {1'799'999'999, 999'999'999},
                                {0, 0},
                                {-1, 0},
                                {-62'135'596'800, 0},  // 0001-01-01
                                {std::numeric_limits<int64_t>::min(), 0},
                                {std::numeric_limits<int64_t>::min(), 999'999'999}}) {
    SCOPED_TRACE(testing::Message() << seconds << " s " << nanos << " ns");
    ExpectError(CheckDeadline(WithDeadline(seconds, nanos), kNow),
                absl::StatusCode::kDeadlineExceeded, "DEADLINE");
  }
}

TEST(CheckDeadline, NanosOutsideATimestampAreMalformed) {
  for (int32_t nanos : {-1, 1'000'000'000, std::numeric_limits<int32_t>::max(),
                        std::numeric_limits<int32_t>::min()}) {
    SCOPED_TRACE(nanos);
    // Malformed whether the seconds are past or future.
    ExpectError(CheckDeadline(WithDeadline(1'900'000'000, nanos), kNow),
                absl::StatusCode::kInvalidArgument, "BAD_DEADLINE");
    ExpectError(CheckDeadline(WithDeadline(-5, nanos), kNow),
                absl::StatusCode::kInvalidArgument, "BAD_DEADLINE");
  }
}

}  // namespace
}  // namespace fuselink::services
