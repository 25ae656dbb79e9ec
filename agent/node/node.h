// One agent's data plane, assembled: topology, fabric, tensor registry, transfer
// engine (source side), landing (target side), peers. Routes the fabric's events to
// the parts that own them. The gRPC services and the metrics read it.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "agent/common/housekeeper.h"
#include "agent/common/stats.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/fabric_keys.h"
#include "agent/fabric/in_node/fabric.h"
#include "agent/gpu/copy_bound.h"
#include "agent/gpu/runtime.h"
#include "agent/memory/fd_tokens.h"
#include "agent/memory/registry.h"
#include "agent/nicstat/foreign_watch.h"
#include "agent/node/ipc_imports.h"
#include "agent/node/local_route.h"
#include "agent/node/watch_hub.h"
#include "agent/peer/notifier.h"
#include "agent/peer/peer_directory.h"
#include "agent/relay/device_stager.h"
#include "agent/relay/gpu_relay_pool.h"
#include "agent/sched/scheduler.h"
#include "agent/security/guard.h"
#include "agent/topo/topology.h"
#include "agent/transfer/engine.h"
#include "agent/transfer/landing.h"
#include "services/handle_socket/stats.h"

namespace fuselink::services {

// The most pinned host memory open windows' shadows may take (verbs), 16 TiB.
inline constexpr uint64_t kMaxShadowBytes = uint64_t{1} << 44;
// The longest the foreign-traffic watch may wait between looks: a NIC's foreign load
// must be seen within about a second.
inline constexpr absl::Duration kMaxForeignCheck = absl::Seconds(1);

// What the node is made of. Validate() checks every field against its range (each
// comment gives it) before Create builds anything.
struct NodeOptions {
  std::string node;
  topo::Topology topology;
  std::map<std::string, std::string> peers;  // node name -> gRPC address
  std::string policy = "fuselink";
  sched::Limits limits;
  // "auto" (verbs where every NIC address has an active RDMA port, else tcp),
  // "tcp" or "verbs".
  std::string transport = "auto";
  int connections_per_nic = 2;  // tcp: connections per NIC and peer
  // tcp: TcpFabricOptions' stall and ACK timeouts, 1 to kMaxTimeoutMs (the ACK
  // timeout is the verbs watchdog's too), and each peer's share of accepted
  // connections (0: sized from connections_per_nic and the NICs).
  int fabric_stall_timeout_ms = 10'000;
  int fabric_ack_timeout_ms = 10'000;
  int fabric_connections_per_peer = 0;
  int qps_per_nic = 2;         // verbs: RC QPs per NIC and peer
  int rdma_traffic_class = 0;  // verbs: GRH traffic class, 0 to kMaxTrafficClass
  int rdma_service_level = 0;  // verbs: service level, 0 to kMaxServiceLevel
  // verbs: QPs one NIC holds over all peers, qps_per_nic to verbs::kMaxQpsPerNic.
  int rdma_max_qps_per_nic = 64;
  // verbs, GPU memory a NIC reaches only by staging: bounce slots per NIC (a chunk
  // each), the most of them one peer holds (0: three quarters), and the pinned host
  // memory open windows' shadows may take. Slots 1 to kMaxStagingSlotsPerNic, the
  // peer's 0 to those, shadows 1 MiB to kMaxShadowBytes.
  uint32_t rdma_staging_slots = 8;
  uint32_t rdma_staging_slots_per_peer = 0;
  // verbs: the farthest PCIe class at which a NIC reads and writes a GPU's memory
  // itself (GPUDirect); farther pairs stage.
  v1::PathClass gpudirect_max_class = v1::PATH_CLASS_PXB;
  uint64_t rdma_max_shadow_bytes = uint64_t{1} << 30;
  transfer::EngineOptions engine;
  transfer::LandingOptions landing;
  // What one engine may register (--max_tensors_per_engine,
  // --max_layout_parts_per_engine), and the watch streams one identity may hold
  // (--max_watches_per_identity).
  memory::OwnerShares shares;
  size_t max_watches_per_identity = kDefaultWatchesPerIdentity;  // at least 1
  // GPU paths: "auto" (on where the driver finds GPUs) or "off".
  std::string gpu = "auto";
  // The longest one GPU copy is waited for (gpu/copy_bound.h); 1 to kMaxTimeoutMs.
  int gpu_copy_timeout_ms = 10'000;
  relay::GpuRelayOptions gpu_relay;
  // Pieces the TCP fabric moves GPU bytes in, through pinned host memory.
  uint32_t stage_piece_bytes = 2 << 20;
  // Who may do what (agent/security); open_access is --plaintext.
  security::Policy access_policy = security::Policy::Default();
  bool open_access = false;
  // Peer.ForwardTransfer is served (--accept_forwarded).
  bool accept_forwarded = false;
  // Calls to peer agents; null: plaintext.
  peer::PeerCredentials peer_credentials;
  // Traffic that is not ours (agent/nicstat): how it is judged, how often looked at.
  // `foreign.rdma` is set by the node from the transport it picks.
  nicstat::ForeignOptions foreign;
  absl::Duration foreign_check = absl::Milliseconds(10);  // 1 ms to kMaxForeignCheck
  // How long registering a CUDA IPC handle waits for the same handle's import to
  // finish closing (ipc_imports.h); 1 ms to kMaxIpcCloseWait.
  absl::Duration ipc_close_wait = kIpcCloseWait;
  // Peer.PrepareIncoming's work where the landing's Prepare may block (verbs:
  // registrations, the window's handshake; on TCP it runs on gRPC's thread), off
  // gRPC's threads, a lane per calling node. A source's
  // engine has at most its prepare_threads_per_target (2) calls here at once, so 4
  // per source leaves room for retries; past a bound: RESOURCE_EXHAUSTED
  // (INCOMING_PREPARES_BUSY).
  transfer::KeyedPoolOptions incoming_prepares = {
      .name = "PrepareIncoming calls from node",
      .thread_name = "fl-incoming",
      .reason = reasons::kIncomingPreparesBusy,
      .threads = 4,
      .running_per_key = 2,
      .pending_per_key = 4,
      .pending_total = 32,
  };
  // Agent.RegisterTensor's work (mapping, populating and registering memory with
  // the fabric), off gRPC's threads, a lane per caller; past a bound:
  // RESOURCE_EXHAUSTED (REGISTRATIONS_BUSY).
  transfer::KeyedPoolOptions registrations = {
      .name = "RegisterTensor calls of",
      .thread_name = "fl-register",
      .reason = reasons::kRegistrationsBusy,
      .threads = 2,
      .running_per_key = 1,
      .pending_per_key = 16,
      .pending_total = 64,
  };

  // INVALID_ARGUMENT naming the first field out of its range, nested ones by their
  // path ("engine.window_chunks"; agent/common/options.h). Create checks it first.
  absl::Status Validate() const;
};

class Node final : public fabric::Handler, public stats::Source {
 public:
  static absl::StatusOr<std::unique_ptr<Node>> Create(NodeOptions options,
                                                      transfer::EngineObserver* observer);
  ~Node() override;

  // Stops moving data: connects under way end, peer calls are cancelled, the engine
  // stops admitting, fails what runs (SHUTTING_DOWN) and joins its threads, and the
  // landing tells every open slot's end. Idempotent; the destructor calls it too.
  void StopTransfers();

  const std::string& name() const { return options_.node; }
  bool accepts_forwarded() const { return options_.accept_forwarded; }
  // The topology with transport and listening ports filled in.
  const v1::Topology& topology() const { return topology_; }
  memory::Registry& registry() { return *registry_; }
  memory::FdTokens& fd_tokens() { return fd_tokens_; }
  IpcImports& ipc_imports() { return ipc_imports_; }
  // What the handle socket that fills fd_tokens() counted; the socket writes them,
  // the metrics read them.
  HandleSocketCounters& handle_socket_counters() { return handle_socket_counters_; }
  transfer::Engine& engine() { return *engine_; }
  // Threads for the services' handlers whose work blocks (PrepareIncoming,
  // RegisterTensor): a handler posts its work and answers from there. They run until
  // the node goes, after the server: every call they took is answered.
  transfer::KeyedPool& incoming_prepares() { return incoming_prepares_; }
  transfer::KeyedPool& registrations() { return registrations_; }
  transfer::Landing& landing() { return *landing_; }
  WatchHub& watch_hub() { return watch_hub_; }
  fabric::Fabric& fabric() { return *fabric_; }
  // The in-node lane, which fabric() is: what it copied.
  fabric::InNodeCounters in_node_counters() const { return in_node_->in_node_counters(); }
  // The keys the fabric proves and checks; the peer bootstrap fills them (Hello).
  fabric::FabricKeys& fabric_keys() { return fabric_keys_; }
  peer::PeerDirectory& peers() { return *peers_; }
  security::Guard& guard() { return guard_; }
  const security::Guard& guard() const { return guard_; }
  const sched::Scheduler& scheduler() const { return *scheduler_; }
  uint64_t notices_dropped() const { return notifier_->dropped(); }
  // Which NICs' foreign traffic is watched, and what it counted.
  const nicstat::ForeignWatch& foreign() const { return *foreign_; }
  // Null without GPUs; then gpu_status() says why.
  const gpu::Runtime* gpu() const { return gpu_.get(); }
  const std::string& gpu_status() const { return gpu_status_; }
  // Null without GPUs, or when a NIC's GPU is not one of them.
  const relay::GpuRelayPool* gpu_relay() const { return gpu_relay_.get(); }
  // Null without GPUs.
  const relay::CudaDeviceStager* stager() const { return stager_.get(); }

  // What the node's parts count, each in its own words; and the NICs' labels for the
  // per-NIC series.
  void ReportStats(stats::Sink& sink) const override;
  std::vector<stats::NicLabel> nic_labels() const;

  // fabric::Handler
  void OnCompletion(const fabric::Completion& completion) override;
  void OnArrival(const fabric::Arrival& arrival) override;
  void OnPeerLost(fabric::PeerId peer, absl::string_view name,
                  const absl::Status& why) override;

 private:
  Node(NodeOptions options, transfer::EngineObserver* observer);
  absl::Status Start();
  absl::StatusOr<std::unique_ptr<fabric::Fabric>> MakeFabric();
  void OpenGpus();
  // The owner GPU of each NIC, in NIC order.
  std::vector<int> NicGpus() const;
  // Stops what uses the tensors whose lending process exited, and lets them go.
  void ReapExitedOwners();
  // Tells the sources of incoming transfers which NICs are idle here.
  void TellIdleNics(uint32_t idle_mask);
  // Makes the engine, with its hooks into the node (watches, repairs), and the
  // repair task it asks for.
  void MakeEngine();
  // Adds the never-blocking tasks to housekeeping_ and foreign_watch_ and starts
  // them and repairs_ (whose task Start added before the engine, which asks for it).
  void StartHousekeeping();
  // A housekeeping task, every foreign_check while something moves: the kernel's
  // counters against ours; NICs with foreign traffic going out lend nothing here (the
  // scheduler), those with foreign traffic coming in are not advertised idle to
  // sources (the landing). Returns when to look again.
  absl::Duration WatchForeignTraffic();

  const NodeOptions options_;
  transfer::EngineObserver* const observer_;
  v1::Topology topology_;
  memory::FdTokens fd_tokens_;
  IpcImports ipc_imports_;
  HandleSocketCounters handle_socket_counters_;
  WatchHub watch_hub_;
  security::Guard guard_;
  fabric::FabricKeys fabric_keys_;  // outlives the fabric and the peers
  // Every wait for a GPU copy; outlives everything that copies.
  gpu::CopyBound copy_bound_;
  std::unique_ptr<gpu::Runtime> gpu_;  // outlives everything that copies
  std::string gpu_status_;
  std::unique_ptr<relay::CudaDeviceStager> stager_;  // outlives the fabric
  // Teardown (~Node): the engine stops admitting, fails what runs and joins its
  // threads; the landing tells every open slot's end; the notifier stops; the fabric
  // goes (flushing every write in flight into the engine); then the rest.
  std::unique_ptr<memory::Registry> registry_;
  std::unique_ptr<sched::Scheduler> scheduler_;
  std::unique_ptr<relay::GpuRelayPool> gpu_relay_;
  std::unique_ptr<peer::PeerDirectory> peers_;
  std::unique_ptr<peer::Notifier> notifier_;
  std::unique_ptr<transfer::Landing> landing_;
  std::unique_ptr<LocalRoute> route_;  // the engine's peers
  std::unique_ptr<transfer::Engine> engine_;
  std::unique_ptr<fabric::Fabric> fabric_;   // the in-node lane around the NICs' fabric
  fabric::InNodeFabric* in_node_ = nullptr;  // fabric_
  std::unique_ptr<nicstat::ForeignWatch> foreign_;
  std::atomic<bool> stop_{false};
  static constexpr absl::Duration kExpireEvery = absl::Milliseconds(200);
  static constexpr absl::Duration kRepairEvery = absl::Seconds(5);
  // The node's periodic work that never blocks: expiring slots, reaping exited
  // lenders, maintaining the GPU relay. Stopped first by StopTransfers (with
  // foreign_watch_): its tasks call into the landing, the notifier and the engine.
  Housekeeper housekeeping_{"fl-housekeeping", /*never_blocks=*/true};
  // WatchForeignTraffic, where some NIC is watched: a thread of its own, since its
  // 10 ms cadence is what bounds a give-back to foreign traffic, which a slow expiry
  // (a landing busy with many slots) must not delay.
  Housekeeper foreign_watch_{"fl-foreign", /*never_blocks=*/true};
  uint32_t foreign_busy_told_ = 0;  // WatchForeignTraffic's; foreign_watch_ only
  // Re-opens failed NICs of peer sessions, apart: its connects may take seconds. Run
  // every kRepairEvery, and at once when a transfer finds a NIC failed (the engine's
  // on_nic_lost).
  Housekeeper repairs_{"fl-repairs", /*never_blocks=*/false};
  Housekeeper::TaskId repair_task_ = -1;
  // Stopped (running what they queued) by ~Node once the transfers stopped, while the
  // landing and the registry they call into are still there.
  transfer::KeyedPool incoming_prepares_;
  transfer::KeyedPool registrations_;
};

}  // namespace fuselink::services
