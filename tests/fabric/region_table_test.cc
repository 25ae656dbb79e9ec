#include "agent/fabric/region_table.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace fuselink::fabric {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

static_assert(ExtentFits(0, 0, 0));
static_assert(ExtentFits(0, 10, 10));
static_assert(ExtentFits(10, 0, 10));
static_assert(!ExtentFits(11, 0, 10));
static_assert(!ExtentFits(1, 10, 10));
static_assert(!ExtentFits(kMax, 2, 10));  // offset + bytes wraps to 1
static_assert(!ExtentFits(2, kMax, 10));
static_assert(ExtentFits(kMax - 1, 1, kMax));

TEST(RegionTableTest, RegistersFindsAndDeregisters) {
  std::vector<uint8_t> memory(100);
  RegionTable table;
  absl::StatusOr<RegionKey> key = table.Register(memory.data(), memory.size(), nullptr);
  ASSERT_TRUE(key.ok());
  EXPECT_NE(*key, 0u);
  absl::StatusOr<std::shared_ptr<const Region>> found = table.Find(*key, 90, 10);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ((*found)->base, memory.data());
  EXPECT_EQ(table.Find(*key, 91, 10).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(table.Find(*key + 1, 0, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(table.Deregister(*key).ok());
  EXPECT_EQ(table.Find(*key, 0, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Deregister(*key).code(), absl::StatusCode::kNotFound);
}

TEST(RegionTableTest, KeysAreNotReused) {
  std::vector<uint8_t> memory(8);
  RegionTable table;
  RegionKey first = *table.Register(memory.data(), memory.size(), nullptr);
  ASSERT_TRUE(table.Deregister(first).ok());
  EXPECT_NE(*table.Register(memory.data(), memory.size(), nullptr), first);
}

TEST(RegionTableTest, HoldersKeepTheMemoryAlive) {
  auto memory = std::make_shared<std::vector<uint8_t>>(8);
  std::weak_ptr<std::vector<uint8_t>> watch = memory;
  RegionTable table;
  RegionKey key = *table.Register(memory->data(), memory->size(), memory);
  memory.reset();
  std::shared_ptr<const Region> held = *table.Find(key, 0, 8);
  ASSERT_TRUE(table.Deregister(key).ok());
  EXPECT_FALSE(watch.expired());
  held.reset();
  EXPECT_TRUE(watch.expired());
}

TEST(RegionTableTest, RejectsEmptyRegions) {
  uint8_t byte = 0;
  RegionTable table;
  EXPECT_EQ(table.Register(nullptr, 8, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.Register(&byte, 0, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fuselink::fabric
