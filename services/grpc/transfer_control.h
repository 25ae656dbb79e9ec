// The calls a router makes on a transfer it started (GetTransfer, CancelTransfer,
// LayersReady, ExtendLease), as one message (v1::ForwardControlRequest): run here
// when this node is the transfer's source, or forwarded to the source's agent over
// the peer link when another node is, so that any agent of the cluster can be asked.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "agent/security/guard.h"
#include "agent/transfer/engine.h"
#include "fuselink/v1/peer.pb.h"

namespace fuselink::services {

// Which transfer the call names and what it does to it; the oneof holds one of the
// four requests. `requester` and `from_node` are left for the forwarding agent.
v1::ForwardControlRequest ControlOf(const v1::GetTransferRequest& request);
v1::ForwardControlRequest ControlOf(const v1::CancelTransferRequest& request);
v1::ForwardControlRequest ControlOf(const v1::LayersReadyRequest& request);
v1::ForwardControlRequest ControlOf(const v1::ExtendLeaseRequest& request);

// The node whose agent answers `call`: its request's source_node, or `self` when
// empty.
const std::string& SourceOf(const v1::ForwardControlRequest& call,
                            const std::string& self);

// What the call does, for a refusal ("<who> may not <action>"); the caller needs
// the router role for it, checked by whoever runs or forwards the call.
absl::string_view ActionOf(const v1::ForwardControlRequest& call);

// Runs `call` on one of `caller`'s own transfers on this node (another router's are
// NOT_FOUND, as if none); the transfer's status is in `response` whenever it was
// found.
absl::Status RunControl(transfer::Engine& engine, const v1::ForwardControlRequest& call,
                        const security::Caller& caller, v1::TransferStatus* response);

}  // namespace fuselink::services
