// The geometry of a tensor: layers x blocks x block bytes, with strides. Pure math;
// every function is safe against overflow on hostile values.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace fuselink::memory {

// Bounds on what a layout may describe; a request over them is INVALID_ARGUMENT.
inline constexpr uint32_t kMaxLayers = 4096;
inline constexpr uint32_t kMaxBlocksPerLayer = 1u << 24;

struct Layout {
  uint32_t layers = 0;
  uint32_t blocks_per_layer = 0;
  uint64_t block_bytes = 0;
  uint64_t block_stride_bytes = 0;  // never 0 once normalized
  uint64_t layer_stride_bytes = 0;  // never 0 once normalized

  // Offset of block `block` of layer `layer` from the tensor's first byte.
  uint64_t BlockOffset(uint32_t layer, uint32_t block) const {
    return layer * layer_stride_bytes + block * block_stride_bytes;
  }
  // True when consecutive blocks of a layer are contiguous in memory.
  bool blocks_packed() const { return block_stride_bytes == block_bytes; }
};

// Fills zero strides with their packed values and checks the layout: non-empty,
// within the bounds, blocks of a layer not overlapping, layers not overlapping, and
// the extent (one past the last byte of the last block) no larger than
// `memory_bytes`. Errors are INVALID_ARGUMENT with reason BAD_LAYOUT or
// LAYOUT_EXCEEDS_MEMORY.
absl::StatusOr<Layout> NormalizeLayout(Layout layout, uint64_t memory_bytes);

}  // namespace fuselink::memory
