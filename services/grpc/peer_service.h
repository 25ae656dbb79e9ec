// The agent-to-agent control service (fuselink.v1.Peer): session bootstrap and the
// target's side of a transfer's set-up. Never blocks a gRPC thread: PrepareIncoming's
// work, which does block, runs on the node's incoming_prepares() pool, a lane per
// source node with bounds per source and in all (RESOURCE_EXHAUSTED,
// INCOMING_PREPARES_BUSY past them); the other calls answer from memory. Only peer
// agents may call it, each only for its own node (its certificate's identity).
#pragma once

#include "agent/node/node.h"
#include "fuselink/v1/peer.grpc.pb.h"

namespace fuselink::services {

class PeerService final : public v1::Peer::CallbackService {
 public:
  explicit PeerService(Node* node) : node_(node) {}

  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* context,
                                  const v1::HelloRequest* request,
                                  v1::HelloResponse* response) override;
  grpc::ServerUnaryReactor* PrepareIncoming(
      grpc::CallbackServerContext* context, const v1::PrepareIncomingRequest* request,
      v1::PrepareIncomingResponse* response) override;
  grpc::ServerUnaryReactor* GetIncoming(grpc::CallbackServerContext* context,
                                        const v1::GetIncomingRequest* request,
                                        v1::IncomingState* response) override;
  // A TransferKVCache another agent was asked for, whose source is this node: run as
  // if its requester had asked here (the router role, the source tensor's readers).
  grpc::ServerWriteReactor<v1::TransferEvent>* ForwardTransfer(
      grpc::CallbackServerContext* context,
      const v1::ForwardTransferRequest* request) override;
  // A call on a transfer of this node's that another agent was asked for, answered
  // as if its requester had asked here.
  grpc::ServerUnaryReactor* ForwardControl(grpc::CallbackServerContext* context,
                                           const v1::ForwardControlRequest* request,
                                           v1::TransferStatus* response) override;

 private:
  // The calling peer, if it holds the peer role and `claimed_node` is its own.
  absl::StatusOr<security::Caller> Authorize(grpc::CallbackServerContext* context,
                                             absl::string_view claimed_node);

  Node* const node_;
};

}  // namespace fuselink::services
