// A window's host shadow: where each extent sits, and where an arrival's bytes are.
#include "agent/fabric/verbs/host_shadow.h"

#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"

namespace fuselink::fabric {
namespace {

constexpr uint64_t kPage = 4096;

TEST(ShadowLayout, EachExtentKeepsTheInPageOffsetOfItsIova) {
  const std::vector<Extent> extents = {{0, 100}, {5000, 3}, {9000, 8192}, {20481, 1}};
  for (uint64_t iova_base : {uint64_t{0}, uint64_t{17}, uint64_t{4095}}) {
    const ShadowLayout layout = LayOutShadow(extents, iova_base, kPage);
    ASSERT_EQ(layout.positions.size(), extents.size());
    uint64_t end = 0;
    for (size_t i = 0; i < extents.size(); ++i) {
      EXPECT_EQ(layout.positions[i] % kPage, (iova_base + extents[i].offset) % kPage)
          << "extent " << i << " iova base " << iova_base;
      EXPECT_GE(layout.positions[i], end) << "extents overlap";
      EXPECT_LT(layout.positions[i] - end, kPage) << "more padding than a page";
      end = layout.positions[i] + extents[i].bytes;
    }
    EXPECT_EQ(layout.bytes, end);
  }
}

TEST(HostShadow, FindsBytesInsideOneExtentAndNothingElse) {
  const std::vector<Extent> extents = {{100, 50}, {200, 10}};
  uint64_t allocated = 0;
  absl::StatusOr<std::shared_ptr<const HostShadow>> shadow = HostShadow::Create(
      extents, /*iova_base=*/8, kPage, /*staged_nics=*/0b10,
      [&](uint64_t bytes) -> absl::StatusOr<std::shared_ptr<uint8_t>> {
        allocated = bytes;
        return std::shared_ptr<uint8_t>(
            static_cast<uint8_t*>(std::aligned_alloc(kPage, 2 * kPage)), std::free);
      });
  ASSERT_TRUE(shadow.ok()) << shadow.status();
  EXPECT_EQ((*shadow)->bytes(), allocated);
  EXPECT_FALSE((*shadow)->staged_on(0));
  EXPECT_TRUE((*shadow)->staged_on(1));
  EXPECT_FALSE((*shadow)->staged_on(64));
  EXPECT_FALSE((*shadow)->staged_on(-1));
  EXPECT_EQ((*shadow)->At(100, 50), (*shadow)->extent_base(0));
  EXPECT_EQ((*shadow)->At(120, 30), (*shadow)->extent_base(0) + 20);
  EXPECT_EQ((*shadow)->At(205, 5), (*shadow)->extent_base(1) + 5);
  EXPECT_EQ((*shadow)->At(99, 1), nullptr);     // before the first extent
  EXPECT_EQ((*shadow)->At(140, 11), nullptr);   // past the end of one
  EXPECT_EQ((*shadow)->At(150, 1), nullptr);    // in the gap
  EXPECT_EQ((*shadow)->At(100, 110), nullptr);  // across two
  EXPECT_EQ((*shadow)->At(~uint64_t{0}, 2), nullptr);
}

TEST(HostShadow, AFailedAllocationIsTheError) {
  const std::vector<Extent> extents = {{0, 10}};
  absl::StatusOr<std::shared_ptr<const HostShadow>> shadow = HostShadow::Create(
      extents, 0, kPage, 1, [](uint64_t) -> absl::StatusOr<std::shared_ptr<uint8_t>> {
        return absl::ResourceExhaustedError("no shadow budget");
      });
  EXPECT_EQ(shadow.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace fuselink::fabric
