// The agent-to-agent control service (fuselink.v1.Peer): session bootstrap and the
// target's side of a transfer's set-up. Never blocks a gRPC thread: PrepareIncoming's
// work, where it may block (verbs: registrations, the window's handshake), runs on the
// node's incoming_prepares() pool, a lane per source node with bounds per source and
// in all (RESOURCE_EXHAUSTED, INCOMING_PREPARES_BUSY past them); where it only takes
// locks (TCP) it answers on gRPC's thread, as the other calls do. Only peer
// agents may call it, each only for its own node (its certificate's identity).
#pragma once

#include <string>

#include "agent/fabric/fabric_keys.h"
#include "agent/peer/peer_directory.h"
#include "agent/security/guard.h"
#include "agent/transfer/engine.h"
#include "agent/transfer/landing.h"
#include "agent/transfer/worker_pool.h"
#include "fuselink/v1/peer.grpc.pb.h"

namespace fuselink::services {

// The parts of the node the Peer service calls into, and no others; each outlives
// the service (services/main.cc fills this from its Node).
struct PeerServiceParts {
  std::string node;                                  // this node's name
  const v1::Topology* topology = nullptr;            // Hello's answer
  security::Guard* guard = nullptr;                  // only peers, each for its own node
  fabric::FabricKeys* fabric_keys = nullptr;         // Hello sets a session's keys
  peer::PeerDirectory* peers = nullptr;              // Hello remembers its caller
  transfer::Landing* landing = nullptr;              // this node's transfers as a target
  transfer::Engine* engine = nullptr;                // forwarded transfers and calls
  transfer::KeyedPool* incoming_prepares = nullptr;  // PrepareIncoming where it blocks
  bool accepts_forwarded = false;                    // --accept_forwarded
};

class PeerService final : public v1::Peer::CallbackService {
 public:
  explicit PeerService(PeerServiceParts parts) : parts_(std::move(parts)) {}

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

  const PeerServiceParts parts_;
};

}  // namespace fuselink::services
