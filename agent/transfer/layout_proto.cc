#include "agent/transfer/layout_proto.h"

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::transfer {

absl::StatusOr<memory::Layout> LayoutFromProto(const v1::Layout& proto) {
  if (static_cast<size_t>(proto.parts_size()) > memory::kMaxLayoutParts) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(
            "layout: ", proto.parts_size(), " parts, over ", memory::kMaxLayoutParts)),
        reasons::kBadLayout);
  }
  memory::Layout layout{proto.layers(),
                        proto.blocks_per_layer(),
                        proto.block_bytes(),
                        proto.block_stride_bytes(),
                        proto.layer_stride_bytes(),
                        proto.parts_per_block()};
  layout.parts.reserve(proto.parts_size());
  for (const v1::BlockPart& p : proto.parts()) {
    layout.parts.push_back(
        memory::Part{p.region(), p.offset_bytes(), p.block_stride_bytes(), p.bytes()});
  }
  return layout;
}

void LayoutToProto(const memory::Layout& layout, v1::Layout* proto) {
  proto->set_layers(layout.layers);
  proto->set_blocks_per_layer(layout.blocks_per_layer);
  proto->set_block_bytes(layout.block_bytes);
  proto->set_block_stride_bytes(layout.block_stride_bytes);
  proto->set_layer_stride_bytes(layout.layer_stride_bytes);
  proto->set_parts_per_block(layout.parts_per_block);
  proto->clear_parts();
  for (const memory::Part& p : layout.parts) {
    v1::BlockPart* out = proto->add_parts();
    out->set_region(p.region);
    out->set_offset_bytes(p.offset);
    out->set_block_stride_bytes(p.block_stride);
    out->set_bytes(p.bytes);
  }
}

}  // namespace fuselink::transfer
