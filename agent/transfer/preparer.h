// The step between admission and the window: what the source asks the target to
// prepare (IncomingSpec), and the extents it plans from the target's answer. The
// blocking call itself (PeerLink::PrepareIncoming) runs on the engine's prepare
// threads; these are the pure parts, unit-tested on their own.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/memory/layout.h"
#include "agent/memory/registry.h"
#include "agent/transfer/peer_link.h"
#include "agent/transfer/plan.h"
#include "agent/transfer/transfer.h"

namespace fuselink::transfer {

struct LayerRange {
  uint32_t begin = 0;
  uint32_t end = 0;
};
// The request's layers, or every layer of `source` when it names none.
LayerRange Layers(const v1::TransferRequest& request, const memory::Layout& source);

// What the target is asked to prepare for `transfer`, whose source is `source` (its
// layout and memory; it must outlive the spec) and whose direct NIC is `direct_nic`.
IncomingSpec MakeIncomingSpec(const Transfer& transfer, const memory::TensorInfo& source,
                              int direct_nic);

// The extents that move the request's blocks into the target's, planned from the
// target's answer. The answer is a peer's bytes: a layout that cannot hold the
// request's target blocks and layers, or whose block size differs, is INTERNAL
// (TARGET_PROTOCOL).
absl::StatusOr<std::vector<Extent>> PlanTransfer(const v1::TransferRequest& request,
                                                 const memory::Layout& source,
                                                 const Prepared& target);

}  // namespace fuselink::transfer
