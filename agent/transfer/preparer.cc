#include "agent/transfer/preparer.h"

#include <span>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::transfer {
namespace {

std::span<const uint32_t> Ids(const google::protobuf::RepeatedField<uint32_t>& ids) {
  return {ids.data(), static_cast<size_t>(ids.size())};
}

}  // namespace

LayerRange Layers(const v1::TransferRequest& request, const memory::Layout& source) {
  if (!request.has_layers()) return LayerRange{0, source.layers};
  return LayerRange{request.layers().begin(), request.layers().end()};
}

IncomingSpec MakeIncomingSpec(const Transfer& transfer,
                              const memory::TensorInfo& source_tensor, int direct_nic) {
  const memory::Layout& source = source_tensor.layout;
  const v1::TransferRequest& request = transfer.request();
  const LayerRange layers = Layers(request, source);
  IncomingSpec spec;
  spec.target_node = request.target().node();
  spec.transfer_id = transfer.id();
  spec.tensor = request.target().tensor();
  spec.block_ids.assign(request.target().block_ids().begin(),
                        request.target().block_ids().end());
  spec.layer_begin = layers.begin;
  spec.layer_end = layers.end;
  spec.block_bytes = source.block_bytes;
  spec.total_bytes =
      source.block_bytes * spec.block_ids.size() * (layers.end - layers.begin);
  spec.deadline = transfer.deadline();
  spec.source_nic = direct_nic;
  spec.source_tensor = source_tensor.name;
  spec.source_memory = &source_tensor.memory;
  return spec;
}

absl::StatusOr<std::vector<Extent>> PlanTransfer(const v1::TransferRequest& request,
                                                 const memory::Layout& source,
                                                 const Prepared& target) {
  const LayerRange layers = Layers(request, source);
  absl::Status fits =
      target.layout.block_bytes == source.block_bytes
          ? ValidateBlocks(target.layout, Ids(request.target().block_ids()), "target",
                           false)
          : absl::InvalidArgumentError("its block size differs");
  if (fits.ok()) fits = ValidateLayers(target.layout, layers.begin, layers.end);
  if (!fits.ok()) {
    return WithReason(
        absl::InternalError(absl::StrCat("the target accepted with a layout that does "
                                         "not hold the request: ",
                                         fits.message().substr(0, 256))),
        reasons::kTargetProtocol);
  }
  // Runs per block and layer: at most one per part boundary of either side. Bounded
  // here too, whatever a target accepted.
  const uint64_t runs =
      uint64_t{static_cast<uint32_t>(request.source().block_ids_size())} *
      (layers.end - layers.begin) * (source.part_count() + target.layout.part_count());
  if (runs > kMaxBlockPieces) {
    return WithReason(absl::InvalidArgumentError(
                          absl::StrCat("blocks x layers x parts of both sides is over ",
                                       kMaxBlockPieces, "; split the request")),
                      reasons::kTooFragmented);
  }
  std::vector<Extent> extents =
      PlanExtents(source, target.layout, Ids(request.source().block_ids()),
                  Ids(request.target().block_ids()), layers.begin, layers.end);
  for (const Extent& e : extents) {
    const uint32_t region = memory::RegionOf(e.target_offset);
    if (region >= target.windows.size() || target.windows[region] == 0) {
      return WithReason(
          absl::InternalError(absl::StrCat("the target opened no window on region ",
                                           region, ", which the request writes")),
          reasons::kTargetProtocol);
    }
  }
  return extents;
}

}  // namespace fuselink::transfer
