// How options refuse a field: the message opens with the field, the field rides along,
// a held struct's fields get its path.
#include "agent/common/options.h"

#include <cmath>

#include "gtest/gtest.h"

namespace fuselink {
namespace {

TEST(OptionsTest, InRangeAcceptsItsBoundsAndNamesTheFieldOutside) {
  EXPECT_TRUE(InRange("depth", 1, 1, 3).ok());
  EXPECT_TRUE(InRange("depth", 3, 1, 3).ok());
  const absl::Status over = InRange("depth", 4, 1, 3);
  EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(over.message(), "depth must be 1 to 3, not 4");
  EXPECT_EQ(FieldOf(over), "depth");
  EXPECT_EQ(FieldOf(InRange("depth", 0, 1, 3)), "depth");
}

TEST(OptionsTest, NotANumberIsNeverInRange) {
  EXPECT_EQ(FieldOf(InRange("fraction", std::nan(""), 0.0, 1.0)), "fraction");
}

TEST(OptionsTest, DurationsAreSaidAsDurations) {
  const absl::Status short_wait =
      InRange("idle", absl::Milliseconds(999), absl::Seconds(1), absl::Hours(1));
  EXPECT_EQ(short_wait.message(), "idle must be 1s to 1h, not 999ms");
  EXPECT_TRUE(InRange("idle", absl::Seconds(1), absl::Seconds(1), absl::Hours(1)).ok());
}

TEST(OptionsTest, AtLeastHasNoUpperBound) {
  EXPECT_TRUE(AtLeast<size_t>("total", SIZE_MAX, 4).ok());
  EXPECT_EQ(AtLeast<size_t>("total", 3, 4).message(), "total must be at least 4, not 3");
}

TEST(OptionsTest, WithinFieldGivesThePathOfAHeldStruct) {
  const absl::Status nested = WithinField("engine", InRange("window", 0, 1, 8));
  EXPECT_EQ(nested.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(nested), "engine.window");
  EXPECT_EQ(nested.message(), "engine.window must be 1 to 8, not 0");
  EXPECT_EQ(FieldOf(WithinField("node", nested)), "node.engine.window");
  EXPECT_TRUE(WithinField("engine", absl::OkStatus()).ok());
  // Another error passes as it is.
  const absl::Status other = absl::InternalError("no");
  EXPECT_EQ(WithinField("engine", other), other);
  EXPECT_EQ(FieldOf(other), "");
}

TEST(OptionsDeathTest, CheckOkAbortsWithTheField) {
  EXPECT_DEATH(FL_CHECK_OK(InRange("threads", 0, 1, 256)),
               "threads must be 1 to 256, not 0");
}

}  // namespace
}  // namespace fuselink
