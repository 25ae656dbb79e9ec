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

IncomingSpec MakeIncomingSpec(const Transfer& transfer, const memory::Layout& source,
                              int direct_nic) {
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
        "TARGET_PROTOCOL");
  }
  return PlanExtents(source, target.layout, Ids(request.source().block_ids()),
                     Ids(request.target().block_ids()), layers.begin, layers.end);
}

}  // namespace fuselink::transfer
