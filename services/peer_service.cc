#include "services/peer_service.h"

#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"

namespace fuselink::services {

grpc::ServerUnaryReactor* PeerService::Hello(grpc::CallbackServerContext* context,
                                             const v1::HelloRequest* request,
                                             v1::HelloResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (request->version() != 1) {
    reactor->Finish(ToGrpcStatus(
        WithReason(absl::FailedPreconditionError("peer speaks another protocol version"),
                   "VERSION_MISMATCH")));
    return reactor;
  }
  node_->peers().Remember(request->topology());
  response->set_version(1);
  *response->mutable_topology() = node_->topology();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::PrepareIncoming(
    grpc::CallbackServerContext* context, const v1::PrepareIncomingRequest* request,
    v1::PrepareIncomingResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<v1::PrepareIncomingResponse> prepared =
      node_->landing().Prepare(*request);
  if (prepared.ok()) *response = std::move(*prepared);
  reactor->Finish(ToGrpcStatus(prepared.status()));
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::GetIncoming(grpc::CallbackServerContext* context,
                                                   const v1::GetIncomingRequest* request,
                                                   v1::IncomingState* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<v1::IncomingState> state =
      node_->landing().Query(request->source_node(), request->transfer_id());
  if (state.ok()) *response = std::move(*state);
  reactor->Finish(ToGrpcStatus(state.status()));
  return reactor;
}

}  // namespace fuselink::services
