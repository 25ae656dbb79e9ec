#include "agent/node/node.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/tcp/fabric.h"
#include "agent/fabric/verbs/device.h"
#include "agent/fabric/verbs/fabric.h"
#include "agent/fabric/verbs/nic.h"
#include "agent/relay/cuda_copier.h"
#include "agent/topo/affinity.h"
#include "agent/transfer/imm.h"

namespace fuselink::services {

Node::Node(NodeOptions options, transfer::EngineObserver* observer)
    : options_(std::move(options)),
      observer_(observer),
      ipc_imports_(options_.ipc_close_wait),
      watch_hub_(options_.max_watches_per_identity),
      guard_(options_.access_policy, options_.open_access),
      copy_bound_(absl::Milliseconds(options_.gpu_copy_timeout_ms)),
      incoming_prepares_(options_.incoming_prepares),
      registrations_(options_.registrations) {}

absl::StatusOr<std::unique_ptr<Node>> Node::Create(NodeOptions options,
                                                   transfer::EngineObserver* observer) {
  FL_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Node> node(new Node(std::move(options), observer));
  FL_RETURN_IF_ERROR(node->Start());
  return node;
}

absl::Status Node::Start() {
  topology_ = options_.topology;
  topology_.set_node(options_.node);
  FL_ASSIGN_OR_RETURN(sched::Policy policy, sched::ParsePolicy(options_.policy));

  OpenGpus();
  FL_ASSIGN_OR_RETURN(std::unique_ptr<fabric::Fabric> wire, MakeFabric());
  // In-node moves: this node as a peer of its own, through its copy engines.
  fabric::InNodeOptions in_node;
  in_node.node = options_.node;
  if (gpu_ != nullptr) {
    in_node.copier = [gpu = gpu_.get(), bound = &copy_bound_]()
        -> absl::StatusOr<std::unique_ptr<fabric::DeviceCopier>> {
      return std::make_unique<relay::CudaCopier>(gpu, bound);
    };
  }
  auto lane =
      std::make_unique<fabric::InNodeFabric>(std::move(wire), this, std::move(in_node));
  in_node_ = lane.get();
  fabric_ = std::move(lane);
  topology_.set_transport(std::string(fabric_->transport()));
  for (const fabric::Endpoint& e : fabric_->endpoints()) {
    topology_.mutable_nics(e.nic)->set_port(e.port);
    for (int g = 0; gpu_ != nullptr && g < gpu_->count(); ++g) {
      topology_.mutable_nics(e.nic)->add_gpu_memory_path(fabric_->GpuPath(g, e.nic));
    }
  }

  registry_ = std::make_unique<memory::Registry>(fabric_.get(), options_.shares);
  scheduler_ =
      std::make_unique<sched::Scheduler>(policy, topology_.nics_size(), options_.limits);
  // Host tensors need no relay slots (every NIC reads host memory, so the engine
  // sends a borrowed NIC's chunks straight from the tensor); GPU tensors' chunks are
  // staged on the borrowed NIC's GPU.
  if (gpu_ != nullptr) {
    absl::StatusOr<std::unique_ptr<relay::GpuRelayPool>> pool =
        relay::GpuRelayPool::Create(fabric_.get(), gpu_.get(), &copy_bound_, NicGpus(),
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
  peer::PeerCredentials credentials = options_.peer_credentials;
  if (!credentials) {
    credentials = [](const std::string&) { return grpc::InsecureChannelCredentials(); };
  }
  peers_ = std::make_unique<peer::PeerDirectory>(topology_, fabric_.get(), &fabric_keys_,
                                                 std::move(credentials), options_.peers);
  notifier_ = std::make_unique<peer::Notifier>(
      fabric_.get(), peers_.get(),
      +[](uint32_t imm) { return transfer::ImmOpOf(imm) == transfer::ImmOp::kIdleNics; });
  landing_ = std::make_unique<transfer::Landing>(
      registry_.get(), fabric_.get(), topology_.nics_size(),
      [this](const v1::WatchEvent& e) { watch_hub_.Publish(e); },
      [this](const std::string& source, uint32_t imm) {
        if (source != options_.node) {
          notifier_->Send(source, imm);
          return;
        }
        // An in-node move's verdict: a notice on the in-node lane, which always
        // takes notices (until it stops, when the engine has stopped too).
        in_node_->PostWrite(fabric::InNodeFabric::kSelf, 0, fabric::WriteOp{.imm = imm})
            .IgnoreError();
      },
      [this](uint32_t mask) { TellIdleNics(mask); }, options_.landing);
  route_ =
      std::make_unique<LocalRoute>(options_.node, peers_.get(), landing_.get(), &guard_);
  MakeEngine();
  nicstat::ForeignOptions foreign = options_.foreign;
  foreign.rdma = fabric_->transport() == "verbs";
  std::vector<nicstat::WatchedNic> watched;
  for (const v1::Nic& nic : topology_.nics()) {
    watched.push_back({nic.name(), nic.address(), nic.rate_bytes_per_s()});
  }
  foreign_ = nicstat::ForeignWatch::Create(watched, foreign);
  StartHousekeeping();
  return absl::OkStatus();
}

void Node::MakeEngine() {
  transfer::EngineOptions engine_options = options_.engine;
  engine_options.node = options_.node;
  engine_options.in_node_moves = true;
  engine_options.on_outgoing = [this](const v1::WatchEvent& e) { watch_hub_.Publish(e); };
  // Re-opens failed NICs every kRepairEvery: a rail back from an outage carries chunks
  // again. And as soon as a transfer finds a NIC failed, not at the next period: a
  // peer back from a stall carries transfers again within a connect.
  repair_task_ = repairs_.Add("repair sessions", kRepairEvery, [this] {
    peers_->RepairSessions();
    return kRepairEvery;
  });
  engine_options.on_nic_lost = [this] { repairs_.RunSoon(repair_task_); };
  engine_ = std::make_unique<transfer::Engine>(
      engine_options, topology_, registry_.get(), fabric_.get(), route_.get(),
      scheduler_.get(), gpu_relay_.get(), observer_);
}

void Node::StartHousekeeping() {
  // Expires slots, reaps exited lenders, maintains the GPU relay.
  housekeeping_.Add("expire", kExpireEvery, [this] {
    landing_->Expire(absl::Now());
    ReapExitedOwners();
    if (gpu_relay_ != nullptr) {
      gpu_relay_->Maintain(absl::Now());
      engine_->Kick();  // a relay that has memory again lends again
    }
    if (gpu_ != nullptr) gpu::FreeIdleKept();  // what copies past their bound held
    return kExpireEvery;
  });
  housekeeping_.Start();
  if (foreign_->any_watched()) {
    foreign_watch_.Add("look", absl::ZeroDuration(),
                       [this] { return WatchForeignTraffic(); });
    foreign_watch_.Start();
  }
  repairs_.Start();
}

void Node::StopTransfers() {
  // First: the housekeeping calls into the landing, the notifier and the engine.
  foreign_watch_.Stop();
  housekeeping_.Stop();
  if (fabric_) fabric_->CancelConnects();  // ends the connects the threads below wait on
  if (peers_) peers_->Shutdown();    // cancels peer calls the engine's threads wait on
  if (engine_) engine_->Shutdown();  // joins its threads: nothing posts after this
  if (landing_) landing_->Shutdown();
}

Node::~Node() {
  StopTransfers();
  // After the server: what is queued is answered (quickly: the landing is shut).
  incoming_prepares_.Stop(/*run_queued=*/true);
  registrations_.Stop(/*run_queued=*/true);
  stop_.store(true);
  repairs_.Stop();
  // Null when Start failed before making it (a bad flag, a NIC that will not open).
  if (notifier_) notifier_->Stop();  // posts nothing more; late verdicts are dropped
  fabric_.reset();                   // flushes every write in flight into the engine
  notifier_.reset();
  engine_.reset();
  landing_.reset();
  peers_.reset();
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
  stager_ = std::make_unique<relay::CudaDeviceStager>(gpu_.get(), &copy_bound_, NicGpus(),
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
                   reasons::kOwnerExited);
    engine_->AbortTensor(gone.id, why);
    landing_->AbortTensor(gone.id, why);
    for (fabric::RegionKey key : gone.region_keys) {
      fabric_->DeregisterRegion(key).IgnoreError();
    }
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
                      reasons::kBadTransport);
  }
  if (want == "verbs" || (want == "auto" && fabric::verbs::VerbsAvailable(addresses))) {
    fabric::VerbsFabricOptions verbs;
    verbs.node_name = options_.node;
    verbs.nics = std::move(nics);
    verbs.qps_per_peer_nic = options_.qps_per_nic;
    verbs.max_qps_per_nic = static_cast<uint32_t>(options_.rdma_max_qps_per_nic);
    verbs.rc.traffic_class = static_cast<uint8_t>(options_.rdma_traffic_class);
    verbs.rc.service_level = static_cast<uint8_t>(options_.rdma_service_level);
    verbs.ack_timeout = absl::Milliseconds(options_.fabric_ack_timeout_ms);
    verbs.stall_timeout_ms = options_.fabric_stall_timeout_ms;
    verbs.max_links_per_peer = options_.fabric_connections_per_peer;
    verbs.keys = &fabric_keys_;
    verbs.device_stager = stager_.get();
    verbs.gpu_count = gpu_ != nullptr ? gpu_->count() : 0;
    for (int g = 0; g < verbs.gpu_count; ++g) {
      std::vector<bool>& row = verbs.gpu_direct.emplace_back();
      for (const v1::Nic& nic : topology_.nics()) {
        row.push_back(topo::GpuDirectReaches(g < nic.gpu_distance_size()
                                                 ? nic.gpu_distance(g)
                                                 : v1::PATH_CLASS_UNSPECIFIED,
                                             options_.gpudirect_max_class));
      }
    }
    verbs.staging_slots_per_nic = options_.rdma_staging_slots;
    verbs.staging_slots_per_peer = options_.rdma_staging_slots_per_peer;
    verbs.staging_slot_bytes = options_.engine.chunk_bytes;  // a staged write is a chunk
    verbs.max_shadow_bytes = options_.rdma_max_shadow_bytes;
    return fabric::CreateVerbsFabric(verbs, this);
  }
  fabric::TcpFabricOptions tcp;
  tcp.node_name = options_.node;
  tcp.connections_per_nic = options_.connections_per_nic;
  tcp.stall_timeout_ms = options_.fabric_stall_timeout_ms;
  tcp.ack_timeout_ms = options_.fabric_ack_timeout_ms;
  tcp.max_connections_per_peer = options_.fabric_connections_per_peer;
  tcp.nics = std::move(nics);
  tcp.device_stager = stager_.get();
  tcp.keys = &fabric_keys_;
  return fabric::CreateTcpFabric(tcp, this);
}

void Node::OnCompletion(const fabric::Completion& completion) {
  engine_->OnCompletion(completion);
}

void Node::OnArrival(const fabric::Arrival& arrival) {
  switch (transfer::ImmOpOf(arrival.imm)) {
    case transfer::ImmOp::kIdleNics:
      engine_->OnIdleNics(arrival.peer, transfer::IdleNicsOf(arrival.imm));
      return;
    case transfer::ImmOp::kVerdict:
      engine_->OnVerdict(arrival.peer_name.empty() ? fabric_->PeerName(arrival.peer)
                                                   : std::string(arrival.peer_name),
                         arrival.imm);
      return;
    default:
      landing_->OnArrival(arrival);
  }
}

void Node::TellIdleNics(uint32_t idle_mask) {
  for (const std::string& source : landing_->ActiveSources()) {
    notifier_->Send(source, transfer::EncodeIdleNics(idle_mask));
  }
}

absl::Duration Node::WatchForeignTraffic() {
  // Our bytes on each NIC: what the fabric put on and took off the wire, refused
  // writes included (the kernel counted those too). And bounds on our bytes the
  // kernel may have counted and the fabric not yet. Sending: the chunks in flight
  // there (the fabric counts a write when the target has answered it). Receiving:
  // what the open windows here can still take (Landing::AdmissibleBytes): every
  // byte placed here lands in one, whatever the sources' policy or depths, and the
  // fabric counts a write once all of it was read. One bound for all NICs: which
  // NIC a source's next bytes take is the source's choice.
  const uint64_t chunk_bytes = options_.engine.chunk_bytes;
  const int nics = foreign_->nic_count();
  const auto read_own = [&](std::span<nicstat::OwnBytes> own) {
    const uint64_t rx_slack_bytes = landing_->AdmissibleBytes();
    for (int k = 0; k < nics; ++k) {
      const fabric::NicCounters c = fabric_->counters(k);
      own[k] = nicstat::OwnBytes{.tx = c.wire_tx_bytes,
                                 .rx = c.wire_rx_bytes,
                                 .tx_slack = scheduler_->Stats(k).in_flight * chunk_bytes,
                                 .rx_slack = rx_slack_bytes};
    }
  };
  // A node moving nothing lends nothing: its NICs' states matter again only when a
  // transfer starts, so it looks this many times less often meanwhile (the rate
  // window and the hold still see every look).
  constexpr int kIdleSlowdown = 10;
  const bool moving = landing_->active() > 0 || engine_->active() > 0;
  foreign_->Sample(nicstat::SteadyNow(), read_own);
  const uint32_t tx = foreign_->busy_mask(nicstat::kTx);
  scheduler_->SetForeignBusy(tx);
  landing_->SetForeignBusy(foreign_->busy_mask(nicstat::kRx));
  // A NIC free again: chunks waiting for a completion may take it now.
  if ((foreign_busy_told_ & ~tx) != 0) engine_->Kick();
  foreign_busy_told_ = tx;
  return moving ? options_.foreign_check : options_.foreign_check * kIdleSlowdown;
}

void Node::OnPeerLost(fabric::PeerId peer, absl::string_view name,
                      const absl::Status& why) {
  if (stop_.load()) return;  // shutting down: nothing left to tell
  if (peers_) peers_->OnPeerLost(peer);
  if (landing_) landing_->OnPeerLost(name);
}

std::vector<stats::NicLabel> Node::nic_labels() const {
  std::vector<stats::NicLabel> out;
  for (const v1::Nic& nic : topology_.nics()) {
    out.push_back({nic.name(), static_cast<int>(nic.owner_gpu())});
  }
  return out;
}

void Node::ReportStats(stats::Sink& sink) const {
  using stats::Kind;
  static constexpr stats::Family kInvariantFailures{
      "fuselink_invariant_failures_total",
      "Invariants of the agent's own code (FL_EXPECT, agent/common/check.h) found "
      "broken and gone on from; any is a bug to report.",
      Kind::kCounter};
  static constexpr stats::Family kNoticesDropped{
      "fuselink_notices_dropped_total",
      "Verdict and idle-NIC notices to other agents that were dropped (queue full, or "
      "the node unreachable); a source then asks for its verdict over gRPC.",
      Kind::kCounter};
  static constexpr stats::Family kIncomingPreparesBusy{
      "fuselink_incoming_prepares_busy_total",
      "Peers' PrepareIncoming calls refused past --incoming_prepares_per_source or "
      "--incoming_prepares_pending (RESOURCE_EXHAUSTED, INCOMING_PREPARES_BUSY).",
      Kind::kCounter};
  static constexpr stats::Family kRegistrationsBusy{
      "fuselink_registrations_busy_total",
      "RegisterTensor and UnregisterTensor calls refused past "
      "--registrations_per_caller or --registrations_pending (RESOURCE_EXHAUSTED, "
      "REGISTRATIONS_BUSY).",
      Kind::kCounter};
  const int gpus = gpu_ != nullptr ? gpu_->count() : 0;
  scheduler_->ReportStats(sink);
  landing_->ReportStats(sink);
  fabric_->ReportStats(sink, gpus);
  in_node_->ReportStats(sink);
  foreign_->ReportStats(sink);
  if (gpu_relay_ != nullptr) {
    gpu_relay_->ReportStats(sink, gpus);
    stager_->ReportStats(sink);
  }
  copy_bound_.ReportStats(sink);
  engine_->ReportStats(sink);
  registry_->ReportStats(sink);
  watch_hub_.ReportStats(sink);
  guard_.ReportStats(sink);
  ipc_imports_.ReportStats(sink);
  handle_socket_counters_.ReportStats(sink);
  sink.Add(kInvariantFailures, static_cast<double>(InvariantFailures()));
  sink.Add(kNoticesDropped, static_cast<double>(notifier_->dropped()));
  sink.Add(kIncomingPreparesBusy, static_cast<double>(incoming_prepares_.refused()));
  sink.Add(kRegistrationsBusy, static_cast<double>(registrations_.refused()));
}

}  // namespace fuselink::services
