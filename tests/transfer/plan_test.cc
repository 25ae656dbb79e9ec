#include "agent/transfer/plan.h"

#include "agent/common/status_macros.h"
#include "agent/transfer/imm.h"
#include "gtest/gtest.h"

namespace fuselink::transfer {
namespace {

using memory::Layout;

Layout Packed(uint32_t layers, uint32_t blocks, uint64_t block_bytes) {
  return *memory::NormalizeLayout(Layout{layers, blocks, block_bytes, 0, 0}, UINT64_MAX);
}

TEST(Plan, CoalescesRunsOfConsecutiveBlocksPerLayer) {
  const Layout source = Packed(2, 16, 100), target = Packed(2, 16, 100);
  const std::vector<uint32_t> src = {1, 2, 3, 7, 8}, dst = {4, 5, 6, 0, 9};
  std::vector<Extent> e = PlanExtents(source, target, src, dst, 0, 2);
  // Per layer: 1-3 -> 4-6 one run; 7 -> 0 and 8 -> 9 break (target not consecutive).
  ASSERT_EQ(e.size(), 6u);
  EXPECT_EQ(e[0].layer, 0u);
  EXPECT_EQ(e[0].source_offset, 100u);
  EXPECT_EQ(e[0].target_offset, 400u);
  EXPECT_EQ(e[0].bytes, 300u);
  EXPECT_EQ(e[1].bytes, 100u);
  EXPECT_EQ(e[3].layer, 1u);
  EXPECT_EQ(e[3].source_offset, 1600u + 100);
  uint64_t total = 0;
  for (const Extent& x : e) total += x.bytes;
  EXPECT_EQ(total, 2u * 5 * 100);
}

TEST(Plan, StridedBlocksAreNotMerged) {
  const Layout source = *memory::NormalizeLayout(Layout{1, 4, 100, 128, 0}, UINT64_MAX);
  const std::vector<uint32_t> ids = {0, 1, 2};
  std::vector<Extent> e = PlanExtents(source, Packed(1, 4, 100), ids, ids, 0, 1);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[2].source_offset, 256u);
  EXPECT_EQ(e[2].target_offset, 200u);
}

TEST(Plan, ChunksCoverEveryByteOnce) {
  const std::vector<Extent> extents = {
      {0, 0, 1000, 10}, {0, 50, 5000, 25}, {1, 100, 0, 7}};
  ChunkCursor cursor(extents, 8);
  std::vector<Chunk> chunks;
  Chunk c;
  while (cursor.Next(&c)) chunks.push_back(c);
  EXPECT_EQ(chunks.size(), CountChunks(extents, 8));
  ASSERT_EQ(chunks.size(), 2u + 4u + 1u);
  EXPECT_EQ(chunks[1].source_offset, 8u);
  EXPECT_EQ(chunks[1].bytes, 2u);
  EXPECT_EQ(chunks[5].target_offset, 5000u + 24);
  EXPECT_EQ(chunks[5].bytes, 1u);
  EXPECT_EQ(chunks[6].layer, 1u);
  EXPECT_TRUE(cursor.done());
}

TEST(Plan, ValidationSaysWhichRuleBroke) {
  const Layout l = Packed(4, 8, 64);
  const std::vector<uint32_t> ok = {0, 7}, outside = {8}, twice = {3, 3}, none;
  EXPECT_TRUE(ValidateBlocks(l, ok, "source", true).ok());
  auto s = ValidateBlocks(l, outside, "target", true);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ReasonOf(s), "BLOCK_OUT_OF_RANGE");
  EXPECT_EQ(ReasonOf(ValidateBlocks(l, twice, "target", true)), "DUPLICATE_TARGET_BLOCK");
  EXPECT_TRUE(ValidateBlocks(l, twice, "source", false).ok());  // a source may repeat
  EXPECT_EQ(ReasonOf(ValidateBlocks(l, none, "source", false)), "EMPTY_REQUEST");
  EXPECT_TRUE(ValidateLayers(l, 0, 4).ok());
  EXPECT_EQ(ReasonOf(ValidateLayers(l, 2, 5)), "LAYER_OUT_OF_RANGE");
  EXPECT_EQ(ReasonOf(ValidateLayers(l, 2, 2)), "LAYER_OUT_OF_RANGE");
}

TEST(Imm, RoundTripsSlotAndOp) {
  const SlotId slot{kMaxIncoming - 1, (1u << kImmGenerationBits) - 1};
  const uint32_t imm = EncodeImm(slot, ImmOp::kAbort);
  EXPECT_EQ(ImmSlot(imm).index, slot.index);
  EXPECT_EQ(ImmSlot(imm).generation, slot.generation);
  EXPECT_EQ(ImmOpOf(imm), ImmOp::kAbort);
  EXPECT_EQ(ImmOpOf(EncodeImm(slot, ImmOp::kData)), ImmOp::kData);
}

}  // namespace
}  // namespace fuselink::transfer
