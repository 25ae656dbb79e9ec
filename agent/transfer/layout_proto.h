// memory::Layout to and from its wire form, fuselink.v1.Layout. No checks: what comes
// from the wire goes through memory::NormalizeLayout next.
#pragma once

#include "agent/memory/layout.h"
#include "fuselink/v1/tensor.pb.h"

namespace fuselink::transfer {

// INVALID_ARGUMENT (BAD_LAYOUT) when the parts are more than memory::kMaxLayoutParts,
// before any is copied: a hostile message costs no more than its own size.
absl::StatusOr<memory::Layout> LayoutFromProto(const v1::Layout& proto);
void LayoutToProto(const memory::Layout& layout, v1::Layout* proto);

}  // namespace fuselink::transfer
