#include "services/grpc/peer_service.h"

#include "absl/strings/str_cat.h"
#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"
#include "agent/peer/peer_directory.h"
#include "services/grpc/answer_off_thread.h"
#include "services/grpc/transfer_control.h"
#include "services/grpc/transfer_stream.h"

namespace fuselink::services {
namespace {

absl::Status ForwardingOff(absl::string_view node) {
  return WithReason(absl::PermissionDeniedError(absl::StrCat(
                        "node '", node,
                        "' runs no forwarded transfers (--accept_forwarded): ask its "
                        "own agent")),
                    reasons::kForwardingOff);
}

}  // namespace

absl::StatusOr<security::Caller> PeerService::Authorize(
    grpc::CallbackServerContext* context, absl::string_view claimed_node) {
  security::Guard& guard = *parts_.guard;
  FL_ASSIGN_OR_RETURN(security::Caller caller,
                      guard.Identify(context->auth_context().get()));
  FL_RETURN_IF_ERROR(guard.Require(caller, security::Bit(security::Role::kPeer),
                                   "call the Peer service"));
  FL_RETURN_IF_ERROR(guard.RequireNode(caller, claimed_node));
  return caller;
}

grpc::ServerUnaryReactor* PeerService::Hello(grpc::CallbackServerContext* context,
                                             const v1::HelloRequest* request,
                                             v1::HelloResponse* response) {
  if (absl::StatusOr<security::Caller> caller =
          Authorize(context, request->topology().node());
      !caller.ok()) {
    return Answer(context, caller.status());
  }
  if (request->version() != peer::kPeerProtocolVersion) {
    return Answer(
        context,
        WithReason(absl::FailedPreconditionError("peer speaks another protocol version"),
                   reasons::kVersionMismatch));
  }
  absl::StatusOr<fabric::SessionKey> theirs = peer::ParseFabricKey(request->fabric_key());
  if (!theirs.ok()) return Answer(context, theirs.status());
  const std::string& caller_node = request->topology().node();
  parts_.fabric_keys->SetConnectKey(caller_node, *theirs);
  parts_.peers->Remember(request->topology());
  response->set_version(peer::kPeerProtocolVersion);
  *response->mutable_topology() = *parts_.topology;
  const fabric::SessionKey ours = parts_.fabric_keys->AcceptKey(caller_node);
  response->set_fabric_key(ours.data(), ours.size());
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* PeerService::PrepareIncoming(
    grpc::CallbackServerContext* context, const v1::PrepareIncomingRequest* request,
    v1::PrepareIncomingResponse* response) {
  if (absl::StatusOr<security::Caller> caller =
          Authorize(context, request->source_node());
      !caller.ok()) {
    return Answer(context, caller.status());
  }
  auto prepare = [this, request, response]() -> absl::Status {
    // The source relays who asked it; the target tensor's grants decide.
    security::Guard& guard = *parts_.guard;
    const security::Caller requester = guard.CallerOf(request->requester());
    absl::StatusOr<v1::PrepareIncomingResponse> prepared =
        parts_.landing->Prepare(*request, [&](const memory::TensorInfo& tensor) {
          return guard.RequireGrant(requester, tensor.owner, tensor.writers, "into",
                                    tensor.name);
        });
    if (!prepared.ok()) return prepared.status();
    *response = *std::move(prepared);
    return absl::OkStatus();
  };
  // Where the landing's Prepare may block (verbs: registrations, the fabric's
  // handshake with the caller), on the source's own lane of the node's pool; where it
  // only takes locks (TCP), here: a hop to the pool and back costs each transfer
  // about three context switches and six futex calls at the target
  // (docs/benchmarks.md).
  if (!parts_.landing->PrepareMayBlock()) return Answer(context, prepare());
  return AnswerOffThread(*parts_.incoming_prepares, request->source_node(),
                         std::move(prepare));
}

grpc::ServerWriteReactor<v1::TransferEvent>* PeerService::ForwardTransfer(
    grpc::CallbackServerContext* context, const v1::ForwardTransferRequest* request) {
  absl::StatusOr<transfer::Requester> requester = absl::UnknownError("unset");
  if (absl::StatusOr<security::Caller> peer = Authorize(context, request->from_node());
      !peer.ok()) {
    requester = peer.status();
  } else if (!parts_.accepts_forwarded) {
    requester = ForwardingOff(parts_.node);
  } else {
    // The forwarding agent authenticated its caller; the caller's rights are checked
    // here, by the same rules as a TransferKVCache sent to this agent.
    security::Guard& guard = *parts_.guard;
    requester = RequesterOf(&guard, guard.CallerOf(request->requester()));
  }
  return new TransferStream(*parts_.engine, context, request->request(),
                            std::move(requester));
}

grpc::ServerUnaryReactor* PeerService::ForwardControl(
    grpc::CallbackServerContext* context, const v1::ForwardControlRequest* request,
    v1::TransferStatus* response) {
  if (absl::StatusOr<security::Caller> peer = Authorize(context, request->from_node());
      !peer.ok()) {
    return Answer(context, peer.status());
  }
  if (!parts_.accepts_forwarded) return Answer(context, ForwardingOff(parts_.node));
  security::Guard& guard = *parts_.guard;
  const security::Caller requester = guard.CallerOf(request->requester());
  if (absl::Status s = guard.Require(requester, security::Bit(security::Role::kRouter),
                                     ActionOf(*request));
      !s.ok()) {
    return Answer(context, s);
  }
  return Answer(context, RunControl(*parts_.engine, *request, requester, response));
}

grpc::ServerUnaryReactor* PeerService::GetIncoming(grpc::CallbackServerContext* context,
                                                   const v1::GetIncomingRequest* request,
                                                   v1::IncomingState* response) {
  if (absl::StatusOr<security::Caller> caller =
          Authorize(context, request->source_node());
      !caller.ok()) {
    return Answer(context, caller.status());
  }
  absl::StatusOr<v1::IncomingState> state =
      parts_.landing->Query(request->source_node(), request->transfer_id());
  if (state.ok()) *response = std::move(*state);
  return Answer(context, state.status());
}

}  // namespace fuselink::services
