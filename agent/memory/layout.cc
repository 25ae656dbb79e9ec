#include "agent/memory/layout.h"

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::memory {
namespace {

absl::Status BadLayout(absl::string_view why) {
  return WithReason(absl::InvalidArgumentError(absl::StrCat("layout: ", why)),
                    "BAD_LAYOUT");
}

// a * b, or false when it overflows.
bool Mul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

}  // namespace

absl::StatusOr<Layout> NormalizeLayout(Layout layout, uint64_t memory_bytes) {
  if (layout.layers == 0 || layout.blocks_per_layer == 0 || layout.block_bytes == 0) {
    return BadLayout("layers, blocks_per_layer and block_bytes must be at least 1");
  }
  if (layout.layers > kMaxLayers) {
    return BadLayout(absl::StrCat("more than ", kMaxLayers, " layers"));
  }
  if (layout.blocks_per_layer > kMaxBlocksPerLayer) {
    return BadLayout(absl::StrCat("more than ", kMaxBlocksPerLayer, " blocks per layer"));
  }
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
  if (extent > memory_bytes) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(
            "layout needs ", extent, " bytes but the memory given has ", memory_bytes)),
        "LAYOUT_EXCEEDS_MEMORY");
  }
  return layout;
}

}  // namespace fuselink::memory
