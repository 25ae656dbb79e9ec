// One agent's data plane, assembled: topology, fabric, tensor registry, transfer
// engine (source side), landing (target side), peers. Routes the fabric's events to
// the parts that own them. The gRPC services and the metrics read it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "agent/fabric/fabric.h"
#include "agent/memory/fd_tokens.h"
#include "agent/memory/registry.h"
#include "agent/peer/peer_directory.h"
#include "agent/topo/topology.h"
#include "agent/transfer/engine.h"
#include "agent/transfer/landing.h"
#include "services/watch_hub.h"

namespace fuselink::services {

struct NodeOptions {
  std::string node;
  topo::Topology topology;
  std::map<std::string, std::string> peers;  // node name -> gRPC address
  std::string policy = "static";
  int connections_per_nic = 2;
  transfer::EngineOptions engine;
};

// What the metrics need to hear as it happens.
class NodeObserver {
 public:
  virtual ~NodeObserver() = default;
  virtual void OnTransferFinished(transfer::State state, absl::Duration elapsed,
                                  uint64_t bytes) = 0;
};

class Node final : public fabric::Handler {
 public:
  static absl::StatusOr<std::unique_ptr<Node>> Create(NodeOptions options,
                                                      NodeObserver* observer);
  ~Node() override;

  const std::string& name() const { return options_.node; }
  // The topology with transport and listening ports filled in.
  const v1::Topology& topology() const { return topology_; }
  memory::Registry& registry() { return *registry_; }
  memory::FdTokens& fd_tokens() { return fd_tokens_; }
  transfer::Engine& engine() { return *engine_; }
  transfer::Landing& landing() { return *landing_; }
  WatchHub& watch_hub() { return watch_hub_; }
  fabric::Fabric& fabric() { return *fabric_; }

  // fabric::Handler
  void OnCompletion(const fabric::Completion& completion) override;
  void OnArrival(const fabric::Arrival& arrival) override;
  void OnPeerLost(fabric::PeerId peer, const absl::Status& why) override;

 private:
  Node(NodeOptions options, NodeObserver* observer);
  absl::Status Start();

  const NodeOptions options_;
  NodeObserver* const observer_;
  v1::Topology topology_;
  memory::FdTokens fd_tokens_;
  WatchHub watch_hub_;
  // Teardown order matters: the engine stops posting, the fabric goes (flushing
  // completions into the engine), then the rest.
  std::unique_ptr<memory::Registry> registry_;
  std::unique_ptr<transfer::Landing> landing_;
  std::unique_ptr<peer::PeerDirectory> peers_;
  std::unique_ptr<transfer::Engine> engine_;
  std::unique_ptr<fabric::Fabric> fabric_;
  std::atomic<bool> stop_{false};
  std::thread expirer_;
};

}  // namespace fuselink::services
