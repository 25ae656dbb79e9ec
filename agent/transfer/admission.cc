#include "agent/transfer/admission.h"

#include <span>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/plan.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace fuselink::transfer {
namespace {

std::span<const uint32_t> Ids(const google::protobuf::RepeatedField<uint32_t>& ids) {
  return {ids.data(), static_cast<size_t>(ids.size())};
}

}  // namespace

absl::Status CheckRequestId(absl::string_view request_id) {
  if (request_id.empty() || request_id.size() > kMaxRequestIdBytes) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          "request_id must be 1 to ", kMaxRequestIdBytes, " bytes")),
                      reasons::kBadRequestId);
  }
  return absl::OkStatus();
}

absl::Status CheckLeaseMs(uint32_t lease_ms) {
  if (lease_ms > kMaxLeaseMs) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat("lease_ms is ", lease_ms,
                                                              "; at most ", kMaxLeaseMs)),
                      reasons::kBadLease);
  }
  return absl::OkStatus();
}

absl::Status CheckNodes(const v1::TransferRequest& request, absl::string_view local_node,
                        const PeerLink& peers, bool in_node) {
  const v1::BlockSet& src = request.source();
  const v1::BlockSet& dst = request.target();
  if (src.node() != local_node) {
    if (src.node().empty() || !peers.Knows(src.node())) {
      return WithReason(absl::NotFoundError(absl::StrCat(
                            "unknown source node '", BoundedForMessage(src.node()), "'")),
                        reasons::kUnknownNode);
    }
    return WithReason(absl::FailedPreconditionError(
                          absl::StrCat("source node is '", BoundedForMessage(src.node()),
                                       "'; send the request to that node's agent")),
                      reasons::kSourceNotLocal);
  }
  if (dst.node() == local_node && !in_node) {
    return WithReason(absl::UnimplementedError(
                          "source and target are the same node, and this agent moves "
                          "nothing within its node"),
                      reasons::kLocalTarget);
  }
  if (dst.node() != local_node && !peers.Knows(dst.node())) {
    return WithReason(absl::NotFoundError(absl::StrCat(
                          "unknown target node '", BoundedForMessage(dst.node()), "'")),
                      reasons::kUnknownNode);
  }
  if (src.block_ids_size() != dst.block_ids_size()) {
    return WithReason(absl::InvalidArgumentError(
                          absl::StrCat("source lists ", src.block_ids_size(),
                                       " blocks, target ", dst.block_ids_size())),
                      reasons::kBlockCountMismatch);
  }
  if (dst.node() == local_node && dst.tensor() == src.tensor()) {
    const absl::flat_hash_set<uint32_t> sources(src.block_ids().begin(),
                                                src.block_ids().end());
    for (uint32_t id : dst.block_ids()) {
      if (sources.contains(id)) {
        return WithReason(
            absl::InvalidArgumentError(absl::StrCat("block ", id, " of tensor '",
                                                    BoundedForMessage(src.tensor()),
                                                    "' is both source and target")),
            reasons::kSameBlocks);
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<memory::TensorLease> PinSource(const v1::TransferRequest& request,
                                              memory::Registry& registry) {
  FL_ASSIGN_OR_RETURN(memory::TensorLease lease,
                      registry.Acquire(request.source().tensor()));
  const memory::Layout& layout = lease.info().layout;
  FL_RETURN_IF_ERROR(
      ValidateBlocks(layout, Ids(request.source().block_ids()), "source", false));
  const uint32_t begin = request.has_layers() ? request.layers().begin() : 0;
  const uint32_t end = request.has_layers() ? request.layers().end() : layout.layers;
  FL_RETURN_IF_ERROR(ValidateLayers(layout, begin, end));
  return lease;
}

std::string Fingerprint(const v1::TransferRequest& request) {
  v1::TransferRequest copy = request;
  copy.clear_deadline();
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  copy.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

absl::Time RequestDeadline(const v1::TransferRequest& request) {
  if (!request.has_deadline()) return absl::InfiniteFuture();
  return absl::FromUnixSeconds(request.deadline().seconds()) +
         absl::Nanoseconds(request.deadline().nanos());
}

absl::Status LeaseExpiredStatus() {
  return WithReason(absl::DeadlineExceededError(
                        "the transfer's lease ran out: nobody renewed it (ExtendLease)"),
                    reasons::kLeaseExpired);
}

absl::Status DeadlineStatus() {
  return WithReason(absl::DeadlineExceededError("the transfer's deadline passed"),
                    reasons::kDeadline);
}

absl::Status ShuttingDownStatus() {
  return WithReason(absl::UnavailableError("the agent is shutting down"),
                    reasons::kShuttingDown);
}

}  // namespace fuselink::transfer
