// The geometry of a tensor: layers x blocks x block bytes. A block is either one run of
// bytes at fixed strides in one memory region (the strided form), or several parts,
// each in its own region at its own offset and stride (the parts form: an engine's KV
// cache as it allocates it, one tensor per layer, K and V apart). Pure math; every
// function is safe against overflow on hostile values.
//
// Offsets into a tensor of several regions are tensor offsets: region r's byte o is
// TensorOffset(r, o). Regions are never adjacent in that space, so no run of bytes that
// planning joins crosses from one region into another.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace fuselink::memory {

// Bounds on what a layout may describe; a request over them is INVALID_ARGUMENT.
inline constexpr uint32_t kMaxLayers = 4096;
inline constexpr uint32_t kMaxBlocksPerLayer = 1u << 24;
inline constexpr uint32_t kMaxRegions = 4096;
inline constexpr uint32_t kMaxPartsPerBlock = 16;
inline constexpr size_t kMaxLayoutParts = 16384;  // layers x parts per block

inline constexpr int kRegionShift = 48;
// A region holds fewer bytes than this: its last byte's tensor offset stays below the
// next region's first.
inline constexpr uint64_t kMaxRegionBytes = (uint64_t{1} << kRegionShift) - 1;

constexpr uint64_t TensorOffset(uint32_t region, uint64_t offset) {
  return (uint64_t{region} << kRegionShift) | offset;
}
constexpr uint32_t RegionOf(uint64_t tensor_offset) {
  return static_cast<uint32_t>(tensor_offset >> kRegionShift);
}
constexpr uint64_t OffsetInRegion(uint64_t tensor_offset) {
  return tensor_offset & kMaxRegionBytes;
}

// Where one part of every block of one layer lies: block b's part is the `bytes` at
// `offset + b * block_stride` of region `region`.
struct Part {
  uint32_t region = 0;
  uint64_t offset = 0;
  uint64_t block_stride = 0;  // never 0 once normalized
  uint64_t bytes = 0;
  bool operator==(const Part&) const = default;
};

struct Layout {
  Layout() = default;
  Layout(uint32_t layers, uint32_t blocks_per_layer, uint64_t block_bytes,
         uint64_t block_stride_bytes = 0, uint64_t layer_stride_bytes = 0,
         uint32_t parts_per_block = 0, std::vector<Part> parts = {})
      : layers(layers),
        blocks_per_layer(blocks_per_layer),
        block_bytes(block_bytes),
        block_stride_bytes(block_stride_bytes),
        layer_stride_bytes(layer_stride_bytes),
        parts_per_block(parts_per_block),
        parts(std::move(parts)) {}

  uint32_t layers = 0;
  uint32_t blocks_per_layer = 0;
  uint64_t block_bytes = 0;  // a block's bytes: the sum of its parts'
  // The strided form (no `parts`): block b of layer l starts at
  // l * layer_stride_bytes + b * block_stride_bytes of region 0.
  uint64_t block_stride_bytes = 0;  // never 0 once normalized
  uint64_t layer_stride_bytes = 0;  // never 0 once normalized
  // The parts form: `parts_per_block` parts in every layer, `parts` layer by layer
  // (parts[l * parts_per_block + p] is part p of layer l's blocks). A block's bytes
  // are its parts' in order. The strides above are 0 in this form.
  uint32_t parts_per_block = 0;
  std::vector<Part> parts;

  bool has_parts() const { return !parts.empty(); }
  uint32_t part_count() const { return has_parts() ? parts_per_block : 1; }
  Part part(uint32_t layer, uint32_t p) const {
    if (!has_parts()) {
      return Part{0, layer * layer_stride_bytes, block_stride_bytes, block_bytes};
    }
    return parts[size_t{layer} * parts_per_block + p];
  }
  // Tensor offset of part `p` of block `block` of layer `layer`.
  uint64_t PartOffset(uint32_t layer, uint32_t p, uint32_t block) const {
    const Part x = part(layer, p);
    return TensorOffset(x.region, x.offset + block * x.block_stride);
  }
  bool operator==(const Layout&) const = default;
};

// Fills zero strides (and a zero block_bytes of the parts form) with their packed
// values and checks the layout: non-empty, within the bounds, no byte in two blocks
// or two parts, every part inside its region and every region holding a part.
// `region_bytes` gives the size of each region (one, for the strided form); a size
// over kMaxRegionBytes counts as kMaxRegionBytes, so that every offset the layout
// makes is a tensor offset. Errors are INVALID_ARGUMENT with reason BAD_LAYOUT or
// LAYOUT_EXCEEDS_MEMORY.
absl::StatusOr<Layout> NormalizeLayout(Layout layout,
                                       std::span<const uint64_t> region_bytes);
inline absl::StatusOr<Layout> NormalizeLayout(Layout layout, uint64_t memory_bytes) {
  return NormalizeLayout(std::move(layout), std::span<const uint64_t>(&memory_bytes, 1));
}

// The regions a layout names: one for the strided form, else one past the highest
// part's region (0 when that is over kMaxRegions: the layout is refused anyway).
uint32_t RegionsNamed(const Layout& layout);

}  // namespace fuselink::memory
