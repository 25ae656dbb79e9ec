#include "agent/transfer/plan.h"

#include <algorithm>

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
  // Per layer, in target order: 7 -> 0; 1-3 -> 4-6 one run; 8 -> 9 (the source does
  // not continue from 3).
  ASSERT_EQ(e.size(), 6u);
  EXPECT_EQ(e[0].layer, 0u);
  EXPECT_EQ(e[0].source_offset, 700u);
  EXPECT_EQ(e[0].target_offset, 0u);
  EXPECT_EQ(e[0].bytes, 100u);
  EXPECT_EQ(e[1].source_offset, 100u);
  EXPECT_EQ(e[1].target_offset, 400u);
  EXPECT_EQ(e[1].bytes, 300u);
  EXPECT_EQ(e[2].target_offset, 900u);
  EXPECT_EQ(e[3].layer, 1u);
  EXPECT_EQ(e[3].source_offset, 1600u + 700);
  uint64_t total = 0;
  for (const Extent& x : e) total += x.bytes;
  EXPECT_EQ(total, 2u * 5 * 100);
}

// Whatever order the target's list is in, the writes go front to back in the target
// within each layer, and the runs that continue on both sides still join: evens then
// odds into a reversed source list is one run per layer.
TEST(Plan, ExtentsGoInTargetOrderWithinEachLayer) {
  const Layout layout = Packed(3, 4096, 64);
  std::vector<uint32_t> target;
  for (uint32_t b = 0; b < 4096; b += 2) target.push_back(b);
  for (uint32_t b = 1; b < 4096; b += 2) target.push_back(b);
  std::vector<uint32_t> source(target.size());
  for (size_t i = 0; i < target.size(); ++i) source[i] = 4095 - target[i];
  std::vector<Extent> e = PlanExtents(layout, layout, source, target, 1, 3);
  // The source runs backwards: no two blocks join, but every block is there once.
  ASSERT_EQ(e.size(), 2u * 4096);
  for (size_t i = 0; i < e.size(); ++i) {
    const uint32_t layer = 1 + static_cast<uint32_t>(i / 4096);
    const uint32_t block = i % 4096;
    EXPECT_EQ(e[i].layer, layer) << i;
    EXPECT_EQ(e[i].target_offset, layout.PartOffset(layer, 0, block)) << i;
    EXPECT_EQ(e[i].source_offset, layout.PartOffset(layer, 0, 4095 - block)) << i;
    EXPECT_EQ(e[i].bytes, 64u) << i;
  }
  // Now the source list is the target's: both continue, block after block.
  for (uint32_t& b : source) b = 4095 - b;
  e = PlanExtents(layout, layout, source, target, 1, 3);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].target_offset, layout.PartOffset(1, 0, 0));
  EXPECT_EQ(e[0].bytes, 4096u * 64);
  EXPECT_EQ(e[1].layer, 2u);
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

// Memory for a layout's regions, as plain bytes.
using Regions = std::vector<std::vector<uint8_t>>;

// A block's bytes, its parts' in order.
std::vector<uint8_t> BlockBytes(const Layout& l, const Regions& mem, uint32_t layer,
                                uint32_t block) {
  std::vector<uint8_t> out;
  for (uint32_t p = 0; p < l.part_count(); ++p) {
    const uint64_t at = l.PartOffset(layer, p, block);
    const auto& region = mem[memory::RegionOf(at)];
    const auto begin =
        region.begin() + static_cast<ptrdiff_t>(memory::OffsetInRegion(at));
    out.insert(out.end(), begin, begin + static_cast<ptrdiff_t>(l.part(layer, p).bytes));
  }
  return out;
}

// vLLM's per-layer tensors: region per layer, K parts then V parts.
Layout VllmLayers(uint32_t layers, uint32_t blocks, uint64_t part) {
  Layout l{layers, blocks, 0, 0, 0, 2};
  for (uint32_t r = 0; r < layers; ++r) {
    l.parts.push_back({r, 0, 0, part});
    l.parts.push_back({r, blocks * part, 0, part});
  }
  return *memory::NormalizeLayout(l, std::vector<uint64_t>(layers, 2 * blocks * part));
}

// SGLang's per-layer K and V buffers: two regions per layer, a block's part every
// `part` bytes after `pad` bytes the buffer keeps in front.
Layout SglangLayers(uint32_t layers, uint32_t blocks, uint64_t part, uint64_t pad) {
  Layout l{layers, blocks, 0, 0, 0, 2};
  for (uint32_t r = 0; r < 2 * layers; ++r) l.parts.push_back({r, pad, 0, part});
  return *memory::NormalizeLayout(l,
                                  std::vector<uint64_t>(2 * layers, pad + blocks * part));
}

Regions Alloc(uint64_t bytes_each, uint32_t regions, uint8_t seed) {
  Regions mem(regions, std::vector<uint8_t>(bytes_each));
  for (auto& r : mem) {
    for (auto& b : r) b = seed = static_cast<uint8_t>(seed * 31 + 7);
  }
  return mem;
}

// Applies the plan's extents: source bytes into the target's memory.
void Apply(const std::vector<Extent>& extents, const Regions& from, Regions* to) {
  for (const Extent& e : extents) {
    ASSERT_EQ(memory::RegionOf(e.source_offset),
              memory::RegionOf(e.source_offset + e.bytes - 1));
    ASSERT_EQ(memory::RegionOf(e.target_offset),
              memory::RegionOf(e.target_offset + e.bytes - 1));
    const auto& s = from[memory::RegionOf(e.source_offset)];
    auto& t = (*to)[memory::RegionOf(e.target_offset)];
    std::copy_n(
        s.begin() + static_cast<ptrdiff_t>(memory::OffsetInRegion(e.source_offset)),
        e.bytes,
        t.begin() + static_cast<ptrdiff_t>(memory::OffsetInRegion(e.target_offset)));
  }
}

TEST(PlanParts, BlocksMoveExactlyBetweenEngineLayouts) {
  constexpr uint32_t kLayers = 3, kBlocks = 8;
  constexpr uint64_t kPart = 96;
  const Layout vllm = VllmLayers(kLayers, kBlocks, kPart);
  const Layout sglang = SglangLayers(kLayers, kBlocks, kPart, 32);
  const Layout flat = Packed(kLayers, kBlocks, 2 * kPart);  // one region, K|V per block
  const Regions src = Alloc(2 * kBlocks * kPart, kLayers, 1);
  const std::vector<uint32_t> from = {0, 1, 2, 6}, into = {3, 4, 5, 0};
  const Layout* targets[] = {&sglang, &flat, &vllm};
  for (const Layout* target : targets) {
    Regions dst = target == &sglang ? Alloc(32 + kBlocks * kPart, 2 * kLayers, 2)
                  : target == &flat ? Alloc(kLayers * kBlocks * 2 * kPart, 1, 3)
                                    : Alloc(2 * kBlocks * kPart, kLayers, 4);
    const Regions before = dst;
    const std::vector<Extent> plan = PlanExtents(vllm, *target, from, into, 1, 3);
    uint64_t total = 0;
    for (const Extent& e : plan) total += e.bytes;
    EXPECT_EQ(total, 2u * from.size() * 2 * kPart);
    Apply(plan, src, &dst);
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      for (uint32_t b = 0; b < kBlocks; ++b) {
        const auto it = std::find(into.begin(), into.end(), b);
        const bool moved = layer >= 1 && it != into.end();
        const auto want = moved ? BlockBytes(vllm, src, layer, from[it - into.begin()])
                                : BlockBytes(*target, before, layer, b);
        EXPECT_EQ(BlockBytes(*target, dst, layer, b), want) << layer << "/" << b;
      }
    }
    // Nothing outside the target blocks changed: the block bytes above cover every
    // part, and the padding of the SGLang buffers stayed.
    if (target == &sglang) {
      for (size_t r = 0; r < dst.size(); ++r) {
        EXPECT_TRUE(std::equal(dst[r].begin(), dst[r].begin() + 32, before[r].begin()));
      }
    }
  }
}

TEST(PlanParts, ConsecutiveBlocksJoinWithinAPart) {
  const Layout vllm = VllmLayers(2, 8, 64);
  const std::vector<uint32_t> ids = {2, 3, 4};
  const std::vector<Extent> plan = PlanExtents(vllm, vllm, ids, ids, 0, 2);
  // Per layer: K parts 2-4 one run, V parts 2-4 another; never across regions.
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].bytes, 3u * 64);
  EXPECT_EQ(plan[1].source_offset, memory::TensorOffset(0, 8 * 64 + 2 * 64));
  EXPECT_EQ(plan[2].source_offset, memory::TensorOffset(1, 2 * 64));
}

TEST(PlanParts, BlockRangesAreCutByRegion) {
  const Layout vllm = VllmLayers(3, 8, 64);
  const std::vector<uint32_t> ids = {1, 2, 5};
  auto ranges = BlockRanges(vllm, ids, 1, 3);
  ASSERT_TRUE(ranges.ok()) << ranges.status();
  // Layers 1 and 2: K 1-2, K 5, V 1-2, V 5 in each region.
  ASSERT_EQ(ranges->size(), 8u);
  EXPECT_EQ((*ranges)[0].offset, memory::TensorOffset(1, 64));
  EXPECT_EQ((*ranges)[0].bytes, 128u);
  EXPECT_EQ(memory::RegionOf((*ranges)[4].offset), 2u);
  // Runs are bounded per region, not per tensor: many regions of few runs each pass.
  const Layout many = VllmLayers(64, 4096, 16);
  std::vector<uint32_t> scattered;
  for (uint32_t b = 0; b < 4096; b += 2) scattered.push_back(b);
  auto wide = BlockRanges(many, scattered, 0, 64);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->size(), 64u * 2 * 2048);
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
