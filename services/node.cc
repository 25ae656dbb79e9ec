#include "services/node.h"

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/tcp_fabric.h"

namespace fuselink::services {

Node::Node(NodeOptions options, NodeObserver* observer)
    : options_(std::move(options)), observer_(observer) {}

absl::StatusOr<std::unique_ptr<Node>> Node::Create(NodeOptions options,
                                                   NodeObserver* observer) {
  std::unique_ptr<Node> node(new Node(std::move(options), observer));
  FL_RETURN_IF_ERROR(node->Start());
  return node;
}

absl::Status Node::Start() {
  topology_ = options_.topology;
  topology_.set_node(options_.node);
  FL_ASSIGN_OR_RETURN(std::unique_ptr<transfer::Policy> policy,
                      transfer::MakePolicy(options_.policy));

  fabric::TcpFabricOptions fabric_options;
  fabric_options.node_name = options_.node;
  fabric_options.connections_per_nic = options_.connections_per_nic;
  for (const v1::Nic& nic : topology_.nics()) {
    fabric_options.nics.push_back(fabric::Endpoint{
        static_cast<int>(nic.index()), nic.address(), static_cast<uint16_t>(nic.port())});
  }
  FL_ASSIGN_OR_RETURN(fabric_, fabric::CreateTcpFabric(fabric_options, this));
  topology_.set_transport(std::string(fabric_->transport()));
  for (const fabric::Endpoint& e : fabric_->endpoints()) {
    topology_.mutable_nics(e.nic)->set_port(e.port);
  }

  registry_ = std::make_unique<memory::Registry>(fabric_.get());
  landing_ = std::make_unique<transfer::Landing>(
      registry_.get(), [this](const v1::WatchEvent& e) { watch_hub_.Publish(e); });
  peers_ =
      std::make_unique<peer::PeerDirectory>(topology_, fabric_.get(), options_.peers);
  transfer::EngineOptions engine_options = options_.engine;
  engine_options.node = options_.node;
  engine_ = std::make_unique<transfer::Engine>(
      engine_options, topology_, registry_.get(), fabric_.get(), peers_.get(),
      std::move(policy),
      [this](transfer::State state, absl::Duration elapsed, uint64_t bytes) {
        if (observer_ != nullptr) observer_->OnTransferFinished(state, elapsed, bytes);
      });
  expirer_ = std::thread([this] {
    while (!stop_.load()) {
      absl::SleepFor(absl::Milliseconds(200));
      landing_->Expire(absl::Now());
    }
  });
  return absl::OkStatus();
}

Node::~Node() {
  stop_.store(true);
  if (expirer_.joinable()) expirer_.join();
  if (engine_) engine_->Shutdown();
  fabric_.reset();  // flushes every write in flight into the engine
  engine_.reset();
  peers_.reset();
  landing_.reset();
  registry_.reset();
}

void Node::OnCompletion(const fabric::Completion& completion) {
  engine_->OnCompletion(completion);
}

void Node::OnArrival(const fabric::Arrival& arrival) { landing_->OnArrival(arrival); }

void Node::OnPeerLost(fabric::PeerId peer, const absl::Status& why) {
  if (stop_.load()) return;  // shutting down: nothing left to tell
  if (peers_) peers_->OnPeerLost(peer);
  if (landing_) landing_->OnPeerLost(fabric_->PeerName(peer), why);
}

}  // namespace fuselink::services
