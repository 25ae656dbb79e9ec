// Distinct-byte counting: what a duplicate, an overlap or a gap adds.
#include "agent/transfer/landed_ranges.h"

#include "gtest/gtest.h"

namespace fuselink::transfer {
namespace {

TEST(LandedRanges, CountsEachByteOnce) {
  LandedRanges r;
  EXPECT_EQ(r.Add(100, 50), 50u);
  EXPECT_EQ(r.Add(100, 50), 0u);   // the same chunk again
  EXPECT_EQ(r.Add(120, 10), 0u);   // inside
  EXPECT_EQ(r.Add(140, 20), 10u);  // overlaps the end
  EXPECT_EQ(r.Add(90, 20), 10u);   // overlaps the start
  EXPECT_EQ(r.bytes(), 70u);
  EXPECT_EQ(r.ranges(), 1u);
}

TEST(LandedRanges, JoinsTouchingRangesAndBridgesGaps) {
  LandedRanges r;
  EXPECT_EQ(r.Add(0, 10), 10u);
  EXPECT_EQ(r.Add(20, 10), 10u);
  EXPECT_EQ(r.Add(40, 10), 10u);
  EXPECT_EQ(r.ranges(), 3u);
  EXPECT_EQ(r.Add(10, 10), 10u);  // touches both neighbours
  EXPECT_EQ(r.ranges(), 2u);
  EXPECT_EQ(r.Add(5, 40), 10u);  // spans a gap and two ranges
  EXPECT_EQ(r.ranges(), 1u);
  EXPECT_EQ(r.bytes(), 50u);
  EXPECT_EQ(r.Add(50, 0), 0u);
}

TEST(LandedRanges, OutOfOrderChunksAddUp) {
  LandedRanges r;
  uint64_t added = 0;
  for (uint64_t i : {7, 3, 0, 9, 1, 8, 2, 6, 4, 5, 3, 9}) added += r.Add(i * 4096, 4096);
  EXPECT_EQ(added, 10 * 4096u);
  EXPECT_EQ(r.bytes(), 10 * 4096u);
  EXPECT_EQ(r.ranges(), 1u);
}

}  // namespace
}  // namespace fuselink::transfer
