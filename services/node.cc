#include "services/node.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/tcp_fabric.h"
#include "agent/fabric/verbs_device.h"
#include "agent/fabric/verbs_fabric.h"
#include "agent/transfer/imm.h"

namespace fuselink::services {

Node::Node(NodeOptions options, transfer::EngineObserver* observer)
    : options_(std::move(options)), observer_(observer) {}

absl::StatusOr<std::unique_ptr<Node>> Node::Create(NodeOptions options,
                                                   transfer::EngineObserver* observer) {
  std::unique_ptr<Node> node(new Node(std::move(options), observer));
  FL_RETURN_IF_ERROR(node->Start());
  return node;
}

absl::Status Node::Start() {
  topology_ = options_.topology;
  topology_.set_node(options_.node);
  FL_ASSIGN_OR_RETURN(sched::Policy policy, sched::ParsePolicy(options_.policy));

  OpenGpus();
  FL_ASSIGN_OR_RETURN(fabric_, MakeFabric());
  topology_.set_transport(std::string(fabric_->transport()));
  for (const fabric::Endpoint& e : fabric_->endpoints()) {
    topology_.mutable_nics(e.nic)->set_port(e.port);
  }

  registry_ = std::make_unique<memory::Registry>(fabric_.get());
  scheduler_ =
      std::make_unique<sched::Scheduler>(policy, topology_.nics_size(), options_.limits);
  // One relay slot per chunk a NIC may carry for other GPUs: borrow_depth, or for
  // stripe one transfer's window. At least one, so that a failover away from a dead
  // direct NIC (a chunk on another GPU's NIC under any policy) always has a slot.
  const uint32_t relay_slots = std::max<uint32_t>(1, policy == sched::Policy::kStripe
                                                         ? options_.engine.window_chunks
                                                         : options_.limits.borrow_depth);
  FL_ASSIGN_OR_RETURN(
      relay_, relay::RelayPool::Create(fabric_.get(), topology_.nics_size(), relay_slots,
                                       options_.engine.chunk_bytes));
  if (gpu_ != nullptr) {
    absl::StatusOr<std::unique_ptr<relay::GpuRelayPool>> pool =
        relay::GpuRelayPool::Create(fabric_.get(), gpu_.get(), NicGpus(),
                                    options_.gpu_relay);
    if (pool.ok()) {
      gpu_relay_ = std::move(*pool);
      absl::StrAppend(
          &gpu_status_, "; GPU relay: ", relay::StageModeName(options_.gpu_relay.mode),
          ", at most ", options_.gpu_relay.cap_bytes_per_gpu >> 20, " MiB per GPU");
    } else {
      absl::StrAppend(&gpu_status_, "; no GPU relay: ", pool.status().message());
    }
  }
  landing_ = std::make_unique<transfer::Landing>(
      registry_.get(), topology_.nics_size(),
      [this](const v1::WatchEvent& e) { watch_hub_.Publish(e); },
      [this](uint32_t) {
        absl::MutexLock lock(&credit_mu_);
        credit_pending_ = true;
      });
  peers_ =
      std::make_unique<peer::PeerDirectory>(topology_, fabric_.get(), options_.peers);
  transfer::EngineOptions engine_options = options_.engine;
  engine_options.node = options_.node;
  engine_ = std::make_unique<transfer::Engine>(
      engine_options, topology_, registry_.get(), fabric_.get(), peers_.get(),
      scheduler_.get(), relay_.get(), gpu_relay_.get(), observer_);
  credit_thread_ = std::thread([this] { CreditLoop(); });
  expirer_ = std::thread([this] {
    // Re-open failed NICs this often: a rail back from an outage carries chunks again.
    constexpr int kRepairEveryTicks = 25;  // x 200 ms
    for (int tick = 1; !stop_.load(); ++tick) {
      absl::SleepFor(absl::Milliseconds(200));
      landing_->Expire(absl::Now());
      ReapExitedOwners();
      if (gpu_relay_ != nullptr) gpu_relay_->Maintain(absl::Now());
      if (tick % kRepairEveryTicks == 0) peers_->RepairSessions();
    }
  });
  return absl::OkStatus();
}

Node::~Node() {
  stop_.store(true);
  if (expirer_.joinable()) expirer_.join();
  {
    absl::MutexLock lock(&credit_mu_);
    credit_pending_ = true;  // wakes the loop to see stop_
  }
  if (credit_thread_.joinable()) credit_thread_.join();
  if (engine_) engine_->Shutdown();
  fabric_.reset();  // flushes every write in flight into the engine
  engine_.reset();
  peers_.reset();
  landing_.reset();
  relay_.reset();
  gpu_relay_.reset();
  registry_.reset();
}

void Node::OpenGpus() {
  if (options_.gpu == "off") {
    gpu_status_ = "GPU paths off (--gpu=off)";
    return;
  }
  absl::StatusOr<std::unique_ptr<gpu::Runtime>> runtime =
      gpu::Runtime::Open(topology_.gpus_size());
  if (!runtime.ok()) {
    gpu_status_ = absl::StrCat("no GPUs: ", runtime.status().message(),
                               "; serving host memory only");
    return;
  }
  gpu_ = std::move(*runtime);
  gpu_status_ = absl::StrCat(gpu_->count(), " of the topology's ", topology_.gpus_size(),
                             " GPUs are CUDA devices here");
  stager_ = std::make_unique<relay::CudaDeviceStager>(gpu_.get(), NicGpus(),
                                                      options_.stage_piece_bytes);
}

std::vector<int> Node::NicGpus() const {
  std::vector<int> nic_gpu;
  for (const v1::Nic& nic : topology_.nics()) nic_gpu.push_back(nic.owner_gpu());
  return nic_gpu;
}

void Node::ReapExitedOwners() {
  for (const memory::Revoked& gone : registry_->TakeExitedOwners()) {
    const absl::Status why =
        WithReason(absl::FailedPreconditionError(absl::StrCat(
                       "the process that lent tensor '", gone.name, "' exited")),
                   "OWNER_EXITED");
    engine_->AbortTensor(gone.id, why);
    landing_->AbortTensor(gone.id, why);
    fabric_->DeregisterRegion(gone.region_key).IgnoreError();
  }
}

absl::StatusOr<std::unique_ptr<fabric::Fabric>> Node::MakeFabric() {
  std::vector<fabric::Endpoint> nics = peer::Endpoints(topology_);
  std::vector<std::string> addresses;
  for (const fabric::Endpoint& nic : nics) addresses.push_back(nic.address);
  const std::string& want = options_.transport;
  if (want != "auto" && want != "tcp" && want != "verbs") {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          "transport '", want, "': choose auto, tcp or verbs")),
                      "BAD_TRANSPORT");
  }
  if (want == "verbs" || (want == "auto" && fabric::verbs::VerbsAvailable(addresses))) {
    fabric::VerbsFabricOptions verbs;
    verbs.node_name = options_.node;
    verbs.nics = std::move(nics);
    verbs.qps_per_peer_nic = options_.qps_per_nic;
    return fabric::CreateVerbsFabric(verbs, this);
  }
  fabric::TcpFabricOptions tcp;
  tcp.node_name = options_.node;
  tcp.connections_per_nic = options_.connections_per_nic;
  tcp.nics = std::move(nics);
  tcp.device_stager = stager_.get();
  return fabric::CreateTcpFabric(tcp, this);
}

void Node::OnCompletion(const fabric::Completion& completion) {
  engine_->OnCompletion(completion);
}

void Node::OnArrival(const fabric::Arrival& arrival) {
  if (transfer::ImmOpOf(arrival.imm) == transfer::ImmOp::kCredit) {
    if (engine_) engine_->OnCredit(arrival.peer, transfer::CreditMask(arrival.imm));
    return;
  }
  if (landing_) landing_->OnArrival(arrival);
}

void Node::CreditLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&credit_mu_);
      credit_mu_.Await(absl::Condition(&credit_pending_));
      credit_pending_ = false;
    }
    if (stop_.load()) return;
    const uint32_t mask = landing_->IdleMask();
    for (const std::string& source : landing_->ActiveSources()) {
      absl::StatusOr<fabric::PeerId> peer = peers_->FabricPeer(source);
      if (!peer.ok()) continue;  // the source reaches us; we may not reach it: no credits
      fabric::WriteOp credit;
      credit.imm = transfer::EncodeCredit(mask);
      fabric_->PostWrite(*peer, 0, credit).IgnoreError();
    }
  }
}

void Node::OnPeerLost(fabric::PeerId peer, absl::string_view name,
                      const absl::Status& why) {
  if (stop_.load()) return;  // shutting down: nothing left to tell
  if (peers_) peers_->OnPeerLost(peer);
  if (landing_) landing_->OnPeerLost(name, why);
}

}  // namespace fuselink::services
