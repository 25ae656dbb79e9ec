#include "agent/memory/layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::memory {
namespace {

absl::Status BadLayout(absl::string_view why) {
  return WithReason(absl::InvalidArgumentError(absl::StrCat("layout: ", why)),
                    reasons::kBadLayout);
}

absl::Status ExceedsMemory(uint64_t extent, uint64_t memory_bytes, uint32_t region,
                           bool several) {
  return WithReason(
      absl::InvalidArgumentError(absl::StrCat(
          "layout needs ", extent, " bytes but the memory given",
          several ? absl::StrCat(" as region ", region) : "", " has ", memory_bytes)),
      reasons::kLayoutExceedsMemory);
}

// a * b, or false when it overflows.
bool Mul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// One part of every block of a layer, as the bytes it covers in its region.
struct Span {
  uint32_t region;
  uint64_t begin, end;  // first byte of block 0's part, one past block B-1's
  uint64_t stride, bytes;
};

// Whether two parts that cover overlapping spans share a byte. Parts of one stride
// interleave without touching when their offsets, modulo the stride, leave room for
// each other (K and V halves of one block, say); parts of different strides whose
// spans meet are refused, though some of them would not collide.
bool Collide(const Span& a, const Span& b, uint32_t blocks) {
  if (blocks == 1 || a.stride != b.stride) return true;
  const uint64_t s = a.stride;
  const uint64_t d = ((b.begin % s) + s - (a.begin % s)) % s;  // b after a, mod s
  return d < a.bytes || d + b.bytes > s;
}

absl::StatusOr<Layout> NormalizeStrided(Layout layout, uint64_t memory_bytes) {
  if (layout.block_stride_bytes == 0) layout.block_stride_bytes = layout.block_bytes;
  if (layout.block_stride_bytes < layout.block_bytes) {
    return BadLayout("block_stride_bytes is smaller than block_bytes");
  }
  uint64_t layer_span = 0;  // bytes from a layer's first block to its last block's end
  if (!Mul(layout.blocks_per_layer - 1, layout.block_stride_bytes, &layer_span) ||
      __builtin_add_overflow(layer_span, layout.block_bytes, &layer_span)) {
    return BadLayout("a layer's size overflows 64 bits");
  }
  if (layout.layer_stride_bytes == 0) {
    if (!Mul(layout.blocks_per_layer, layout.block_stride_bytes,
             &layout.layer_stride_bytes)) {
      return BadLayout("a layer's size overflows 64 bits");
    }
  }
  if (layout.layers > 1 && layout.layer_stride_bytes < layer_span) {
    return BadLayout("layer_stride_bytes is smaller than one layer of blocks");
  }
  uint64_t extent = 0;
  if (!Mul(layout.layers - 1, layout.layer_stride_bytes, &extent) ||
      __builtin_add_overflow(extent, layer_span, &extent)) {
    return BadLayout("the tensor's size overflows 64 bits");
  }
  if (extent > memory_bytes) return ExceedsMemory(extent, memory_bytes, 0, false);
  return layout;
}

absl::StatusOr<Layout> NormalizeParts(Layout layout,
                                      std::span<const uint64_t> region_bytes) {
  if (layout.block_stride_bytes != 0 || layout.layer_stride_bytes != 0) {
    return BadLayout(
        "a layout of parts gives each part's stride, not block or layer strides");
  }
  if (layout.parts_per_block == 0 || layout.parts_per_block > kMaxPartsPerBlock) {
    return BadLayout(absl::StrCat("parts_per_block must be 1 to ", kMaxPartsPerBlock));
  }
  const uint64_t want = uint64_t{layout.layers} * layout.parts_per_block;
  if (want > kMaxLayoutParts) {
    return BadLayout(absl::StrCat("layers x parts_per_block is over ", kMaxLayoutParts));
  }
  if (layout.parts.size() != want) {
    return BadLayout(absl::StrCat(layout.parts.size(), " parts given; ", layout.layers,
                                  " layers of ", layout.parts_per_block, " need ", want));
  }
  std::vector<bool> used(region_bytes.size(), false);
  std::vector<Span> spans;
  spans.reserve(layout.parts.size());
  for (uint32_t l = 0; l < layout.layers; ++l) {
    uint64_t sum = 0;
    for (uint32_t p = 0; p < layout.parts_per_block; ++p) {
      Part& x = layout.parts[size_t{l} * layout.parts_per_block + p];
      const std::string where = absl::StrCat("part ", p, " of layer ", l);
      if (x.region >= region_bytes.size()) {
        return BadLayout(
            absl::StrCat(where, " names region ", x.region, " of ", region_bytes.size()));
      }
      if (x.bytes == 0) return BadLayout(absl::StrCat(where, " has no bytes"));
      if (x.block_stride == 0) x.block_stride = x.bytes;
      if (x.block_stride < x.bytes) {
        return BadLayout(
            absl::StrCat(where, ": block_stride_bytes is smaller than bytes"));
      }
      uint64_t end = 0;
      if (!Mul(layout.blocks_per_layer - 1, x.block_stride, &end) ||
          __builtin_add_overflow(end, x.bytes, &end) ||
          __builtin_add_overflow(end, x.offset, &end) ||
          __builtin_add_overflow(sum, x.bytes, &sum)) {
        return BadLayout(absl::StrCat(where, " overflows 64 bits"));
      }
      if (end > region_bytes[x.region]) {
        return ExceedsMemory(end, region_bytes[x.region], x.region, true);
      }
      used[x.region] = true;
      spans.push_back(Span{x.region, x.offset, end, x.block_stride, x.bytes});
    }
    if (layout.block_bytes == 0 && l == 0) layout.block_bytes = sum;
    if (sum != layout.block_bytes) {
      return BadLayout(absl::StrCat("the parts of layer ", l, " hold ", sum,
                                    " bytes of a block, not block_bytes ",
                                    layout.block_bytes));
    }
  }
  for (uint32_t r = 0; r < used.size(); ++r) {
    if (!used[r]) return BadLayout(absl::StrCat("region ", r, " holds no part"));
  }
  // No byte in two parts: a sweep over the spans in address order, each checked
  // against those still open. Interleaving is bounded: past kMaxOpen spans over one
  // byte the layout is refused rather than checked pair by pair.
  constexpr size_t kMaxOpen = 64;
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.region != b.region ? a.region < b.region : a.begin < b.begin;
  });
  std::vector<const Span*> open;
  for (const Span& s : spans) {
    std::erase_if(
        open, [&](const Span* o) { return o->region != s.region || o->end <= s.begin; });
    for (const Span* o : open) {
      if (Collide(*o, s, layout.blocks_per_layer)) {
        return BadLayout(absl::StrCat("two parts share bytes in region ", s.region,
                                      " (at offsets ", o->begin, " and ", s.begin, ")"));
      }
    }
    if (open.size() == kMaxOpen) {
      return BadLayout(
          absl::StrCat("over ", kMaxOpen, " parts interleave in region ", s.region));
    }
    open.push_back(&s);
  }
  return layout;
}

}  // namespace

uint32_t RegionsNamed(const Layout& layout) {
  if (!layout.has_parts()) return 1;
  uint32_t top = 0;
  for (const Part& p : layout.parts) top = std::max(top, p.region);
  return top >= kMaxRegions ? 0 : top + 1;
}

absl::StatusOr<Layout> NormalizeLayout(Layout layout,
                                       std::span<const uint64_t> region_bytes) {
  if (layout.layers == 0 || layout.blocks_per_layer == 0 ||
      (layout.block_bytes == 0 && !layout.has_parts())) {
    return BadLayout("layers, blocks_per_layer and block_bytes must be at least 1");
  }
  if (layout.layers > kMaxLayers) {
    return BadLayout(absl::StrCat("more than ", kMaxLayers, " layers"));
  }
  if (layout.blocks_per_layer > kMaxBlocksPerLayer) {
    return BadLayout(absl::StrCat("more than ", kMaxBlocksPerLayer, " blocks per layer"));
  }
  if (region_bytes.empty() || region_bytes.size() > kMaxRegions) {
    return BadLayout(absl::StrCat("1 to ", kMaxRegions, " memory regions"));
  }
  if (!layout.has_parts()) {
    if (layout.parts_per_block != 0) return BadLayout("parts_per_block without parts");
    if (region_bytes.size() != 1) {
      return BadLayout("a layout of several regions describes its blocks' parts");
    }
    return NormalizeStrided(std::move(layout),
                            std::min(region_bytes[0], kMaxRegionBytes));
  }
  std::vector<uint64_t> bounded(region_bytes.begin(), region_bytes.end());
  for (uint64_t& bytes : bounded) bytes = std::min(bytes, kMaxRegionBytes);
  return NormalizeParts(std::move(layout), bounded);
}

}  // namespace fuselink::memory
