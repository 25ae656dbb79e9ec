#include "agent/node/local_route.h"

#include "absl/strings/str_cat.h"
#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/in_node/fabric.h"

namespace fuselink::services {

void LocalRoute::Bootstrap(absl::string_view node, absl::Time deadline,
                           BootstrapDone done) {
  if (node == node_) {
    std::move(done)(absl::OkStatus());
    return;
  }
  peers_->Bootstrap(node, deadline, std::move(done));
}

absl::StatusOr<transfer::Prepared> LocalRoute::PrepareIncoming(
    const transfer::IncomingSpec& spec) {
  if (spec.target_node != node_) return peers_->PrepareIncoming(spec);
  const security::Caller requester = guard_->CallerOf(spec.requester);
  absl::StatusOr<v1::PrepareIncomingResponse> response = landing_->Prepare(
      peer::PrepareRequestOf(spec, node_),
      [&](const memory::TensorInfo& tensor) -> absl::Status {
        FL_RETURN_IF_ERROR(guard_->RequireGrant(requester, tensor.owner, tensor.writers,
                                                "into", tensor.name));
        // Another registration of the source's own memory (a second mapping of its
        // file, say): the copies would overwrite blocks they have yet to read. Told
        // by the memory, not the name: the source's registration is the one whose
        // memory the spec points at (the job's lease pins it). Within that one
        // registration, distinct blocks (SAME_BLOCKS) are apart only while no two
        // of its regions are one memory, which registration refuses (ALIASED_REGIONS)
        // and is checked again here.
        const bool aliased = spec.source_memory != nullptr &&
                             (&tensor.memory == spec.source_memory
                                  ? memory::SharedWithin(tensor.memory).has_value()
                                  : memory::Overlap(tensor.memory, *spec.source_memory));
        if (aliased) {
          return WithReason(absl::InvalidArgumentError(absl::StrCat(
                                "tensors '", BoundedForMessage(spec.source_tensor),
                                "' and '", BoundedForMessage(tensor.name),
                                "' share memory: a move between them would overwrite "
                                "what it reads")),
                            reasons::kAliasedTensors);
        }
        return absl::OkStatus();
      },
      transfer::Landing::Source::kThisNode);
  if (!response.ok()) return response.status();
  return peer::PreparedOf(*response, fabric::InNodeFabric::kSelf, node_);
}

absl::StatusOr<std::optional<absl::Status>> LocalRoute::QueryVerdict(
    absl::string_view target_node, absl::string_view transfer_id, absl::Time deadline) {
  if (target_node != node_)
    return peers_->QueryVerdict(target_node, transfer_id, deadline);
  absl::StatusOr<v1::IncomingState> state = landing_->Query(node_, transfer_id);
  if (!state.ok()) return state.status();
  return peer::VerdictOf(*state, node_);
}

}  // namespace fuselink::services
