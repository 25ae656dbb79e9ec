// The engine's peers, with this node among them: a transfer whose target is this node
// (an in-node move) is prepared by this node's own landing, in process, under the same
// checks a peer's PrepareIncoming passes (the requester must be a writer of the target
// tensor), and its writes go to the in-node lane (fabric/in_node_fabric.h). Every other
// node is the peer directory's.
#pragma once

#include <string>

#include "agent/peer/peer_directory.h"
#include "agent/security/guard.h"
#include "agent/transfer/landing.h"
#include "agent/transfer/peer_link.h"

namespace fuselink::services {

class LocalRoute final : public transfer::PeerLink {
 public:
  // All outlive the route.
  LocalRoute(std::string node, peer::PeerDirectory* peers, transfer::Landing* landing,
             security::Guard* guard)
      : node_(std::move(node)), peers_(peers), landing_(landing), guard_(guard) {}

  bool Knows(absl::string_view node) const override {
    return node == node_ || peers_->Knows(node);
  }
  bool SessionUp(absl::string_view node) const override {
    return node == node_ || peers_->SessionUp(node);
  }
  void Bootstrap(absl::string_view node, absl::Time deadline,
                 BootstrapDone done) override;
  absl::StatusOr<transfer::Prepared> PrepareIncoming(
      const transfer::IncomingSpec& spec) override;
  absl::StatusOr<std::optional<absl::Status>> QueryVerdict(absl::string_view target_node,
                                                           absl::string_view transfer_id,
                                                           absl::Time deadline) override;

 private:
  const std::string node_;
  peer::PeerDirectory* const peers_;
  transfer::Landing* const landing_;
  security::Guard* const guard_;
};

}  // namespace fuselink::services
