// The agent's flags, each defined here, and their reading into AgentConfig (flags.h).
#include "services/flags.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/common/status_macros.h"
#include "agent/topo/affinity.h"
#include "agent/topo/discovery.h"
#include "services/handle_socket/socket.h"

ABSL_FLAG(std::string, node, "", "This node's name (required).");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "gRPC address; port 0 lets the kernel pick.");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "Prometheus /metrics address as host:port; binds to that address only "
          "(0.0.0.0 or [::] for all); port 0 lets the kernel pick.");
ABSL_FLAG(std::string, metrics_web_config, "",
          "Prometheus web-config YAML file for /metrics: tls_server_config (cert_file, "
          "key_file, client_ca_file, client_auth_type) and basic_auth_users (name: "
          "bcrypt hash); certificates are re-read when they change. Empty: plain HTTP, "
          "no auth.");
ABSL_FLAG(int, metrics_auth_queue_depth, 4,
          "Basic-auth checks (bcrypt, on one worker off the serving thread) that may "
          "wait at once; a request past it is answered 503 with Retry-After at once "
          "(1 to 1024). Credentials that checked out are cached, so a scraper pays "
          "once.");
ABSL_FLAG(std::string, runtime_dir, "/run/fuselink",
          "The agent's private directory (created 0700 if absent; refused unless owned "
          "by the agent's uid with no group/other access).");
ABSL_FLAG(std::string, handle_socket, "",
          "Unix socket for memfds; default <runtime_dir>/<node>.sock. Its directory "
          "passes the --runtime_dir checks.");
ABSL_FLAG(
    std::string, topology, "discover",
    "Where the node's GPUs and NICs come from: discover (sysfs, the CUDA driver and "
    "the interfaces' addresses; the agent refuses to start when no NIC can carry "
    "data), emulated (--nics loopback NICs, one GPU each, for testbeds), or the "
    "path of a topology JSON file.");
ABSL_FLAG(std::vector<std::string>, exclude_nics, {},
          "discover: NICs that must not carry data, by RDMA device, NIC name or netdev, "
          "comma-separated (e.g. mlx5_4,mlx5_5).");
ABSL_FLAG(std::string, sysfs_root, "/sys",
          "discover: the sysfs to read. GPUs come from the CUDA driver only for /sys "
          "itself; another tree (a fixture) is read alone.");
// Optional so that giving them with --topology=discover can be refused: a script
// written for the old emulated default fails at once instead of binding to real NICs.
ABSL_FLAG(std::optional<int>, nics, std::nullopt,
          "--topology=emulated: number of NICs (one GPU each); default 4.");
ABSL_FLAG(std::optional<int>, loopback_net, std::nullopt,
          "--topology=emulated: NIC i at 127.0.<loopback_net>.<i+1>; default 1.");
ABSL_FLAG(std::vector<std::string>, peer, {},
          "Peers as name=host:port, comma-separated.");
ABSL_FLAG(std::string, policy, "fuselink",
          "NIC policy: fuselink (borrow idle NICs, owners first), static (own NIC "
          "only) or stripe (every NIC, owners ignored).");
ABSL_FLAG(uint32_t, direct_depth, 8,
          "Chunks in flight on a GPU's own NIC before it borrows.");
ABSL_FLAG(uint32_t, borrow_depth, 2,
          "Borrowed chunks in flight per NIC: what a returning owner waits for at most.");
ABSL_FLAG(uint32_t, chunk_bytes, 4u << 20, "Bytes per fabric write.");
ABSL_FLAG(uint32_t, window_chunks, 16, "Chunks in flight per transfer.");
ABSL_FLAG(uint32_t, max_transfers, 64, "Outgoing transfers in flight at once.");
// Shares per identity (docs/security.md): past one, RESOURCE_EXHAUSTED with its reason.
// Under --plaintext every caller is one identity, so each is a bound on the whole.
ABSL_FLAG(uint32_t, max_transfers_per_router, 32,
          "Of --max_transfers, those one router may hold in flight at once "
          "(TRANSFER_SHARE).");
ABSL_FLAG(uint32_t, max_tensors_per_engine, fuselink::memory::kMaxTensors / 4,
          "Tensors one engine may hold registered at once, of 65536 (TENSOR_SHARE).");
ABSL_FLAG(uint64_t, max_layout_parts_per_engine, uint64_t{1} << 20,
          "Layout parts (32 bytes of agent memory each) over all of one engine's "
          "tensors (LAYOUT_PART_SHARE).");
ABSL_FLAG(uint32_t, max_watches_per_identity,
          fuselink::services::kDefaultWatchesPerIdentity,
          "WatchTransfers streams one identity may hold open at once (WATCH_SHARE).");
ABSL_FLAG(uint32_t, grpc_max_streams_per_connection, 1024,
          "Concurrent gRPC calls one client connection may have open "
          "(GRPC_ARG_MAX_CONCURRENT_STREAMS); a client past it waits for one to end.");
ABSL_FLAG(uint32_t, incoming_per_source, fuselink::transfer::kMaxIncoming / 4,
          "Incoming transfers one source node may hold here at once, open or still "
          "draining (of 4096).");
ABSL_FLAG(uint32_t, incoming_start_timeout_ms, 5000,
          "An incoming transfer whose source sends nothing this long after preparing "
          "it fails SOURCE_IDLE, letting go of its tensor.");
ABSL_FLAG(uint32_t, incoming_idle_timeout_ms, 30'000,
          "An incoming transfer that has begun and then sees nothing from its source "
          "this long (a source stopped or gone without a word) fails SOURCE_IDLE, "
          "letting go of its tensor; 1000 to 3600000.");
ABSL_FLAG(uint32_t, ipc_close_wait_ms, 5000,
          "Registering a CUDA IPC handle whose previous import is still closing waits "
          "this long for the close, then fails UNAVAILABLE (GPU_HANDLE_CLOSING); "
          "1 to 60000.");
ABSL_FLAG(uint32_t, prepare_threads, 8,
          "Threads that call remote targets (PrepareIncoming, QueryVerdict), shared by "
          "the targets (1 to 256).");
ABSL_FLAG(uint32_t, prepare_threads_per_target, 2,
          "Of --prepare_threads, the most one target's calls hold at once: a target "
          "that hangs delays only its own transfers (1 to --prepare_threads).");
ABSL_FLAG(uint32_t, prepare_queue_per_target, 0,
          "Calls to one target queued or running; a transfer past it fails "
          "RESOURCE_EXHAUSTED (PREPARE_QUEUE_FULL). 0: twice --max_transfers, which "
          "the transfers admitted never reach, so all of them may go to one target.");
ABSL_FLAG(uint32_t, incoming_prepare_threads, 4,
          "Threads that run peers' PrepareIncoming calls, off gRPC's (1 to 256).");
ABSL_FLAG(uint32_t, incoming_prepares_per_source, 4,
          "PrepareIncoming calls of one source node queued or running here; past it, "
          "or past --incoming_prepares_pending in all, RESOURCE_EXHAUSTED "
          "(INCOMING_PREPARES_BUSY).");
ABSL_FLAG(uint32_t, incoming_prepares_pending, 32,
          "PrepareIncoming calls queued or running here, of all sources.");
ABSL_FLAG(uint32_t, register_threads, 2,
          "Threads that map and register tensors' memory, off gRPC's (1 to 256).");
ABSL_FLAG(uint32_t, registrations_per_caller, 16,
          "RegisterTensor and UnregisterTensor calls of one caller queued or running; "
          "past it, or past "
          "--registrations_pending in all, RESOURCE_EXHAUSTED (REGISTRATIONS_BUSY).");
ABSL_FLAG(uint32_t, registrations_pending, 64,
          "RegisterTensor and UnregisterTensor calls queued or running, of all callers.");
ABSL_FLAG(int64_t, foreign_busy_bytes_per_s, -1,
          "Foreign traffic (bytes on a NIC that fuselink did not move, from the "
          "kernel's counters) at or above this rate makes the NIC busy for lending; "
          "-1: 5% of the NIC's line rate (the topology's rate_bytes_per_s); 0: off.");
ABSL_FLAG(double, foreign_overhead_pct, 5,
          "Kernel bytes that fuselink's own payload costs on top of itself the same "
          "way (its frames' headers), in percent of that payload: not counted as "
          "foreign. 0 to 100.");
ABSL_FLAG(double, foreign_ack_overhead_pct, 2.5,
          "Kernel bytes that fuselink's own payload costs the other way (the "
          "acknowledgements of what it sends or receives), in percent of that "
          "payload: not counted as foreign. 0 to 100.");
ABSL_FLAG(uint32_t, foreign_check_ms, 10, "How often NIC counters are read (1 to 1000).");
ABSL_FLAG(uint32_t, foreign_hold_ms, 300,
          "A foreign-busy NIC lends again once its foreign rate stayed under half the "
          "threshold this long.");
ABSL_FLAG(std::string, transport, "auto",
          "auto (verbs where every NIC address is an active RDMA port, else tcp), tcp or "
          "verbs.");
ABSL_FLAG(int, connections_per_nic, 2, "tcp: connections per NIC and peer.");
ABSL_FLAG(int, fabric_stall_timeout_ms, 10'000,
          "tcp: once a frame from a peer has begun, the longest it may send no byte of "
          "it (or take no byte of an ACK); past it the connection closes and the write "
          "it carried fails (reason FABRIC_STALL). 1 to 3600000.");
ABSL_FLAG(int, fabric_ack_timeout_ms, 10'000,
          "While writes of ours are on a connection (tcp) or QP (verbs), the longest "
          "without an acknowledgement; past it the connection or QP closes and its "
          "writes go again on others (tcp: reason FABRIC_ACK_TIMEOUT). 1 to 3600000.");
ABSL_FLAG(uint32_t, transfer_drain_timeout_ms, 10'000,
          "Once a transfer has ended (deadline, lease, cancel, the verdict given up on), "
          "the longest its writes may stay in flight; past it the connections to its "
          "target close, failing them, so that the transfer ends and its tensor is "
          "let go of (counted in fuselink_transfer_forced_drains_total). 1 to "
          "3600000.");
ABSL_FLAG(int, fabric_connections_per_peer, 0,
          "tcp: accepted fabric connections one authenticated peer may hold; more are "
          "refused (reason FABRIC_PEER_CONNECTIONS). 0: twice connections_per_nic "
          "times the NICs.");
ABSL_FLAG(int, qps_per_nic, 2, "verbs: RC queue pairs per NIC and peer.");
ABSL_FLAG(int, rdma_traffic_class, 0,
          "verbs: the GRH traffic class of every QP (0-255). On RoCE its upper six bits "
          "are the DSCP: set the one the fabric maps to its lossless class, e.g. 106 for "
          "DSCP 26 with ECN.");
ABSL_FLAG(int, rdma_service_level, 0, "verbs: the service level of every QP (0-15).");
ABSL_FLAG(std::string, gpudirect_max_class, "PXB",
          "verbs: the farthest PCIe class (PIX, PXB, PHB, NODE, SYS) at which a NIC "
          "reads and writes a GPU's memory itself (GPUDirect RDMA by dma-buf or peer "
          "memory); farther GPU-NIC pairs stage through host memory.");
ABSL_FLAG(uint32_t, rdma_staging_slots, 8,
          "verbs: bounce slots per NIC (a chunk each, pinned) for GPU memory the NIC "
          "can reach only through host memory (1-4096).");
ABSL_FLAG(uint64_t, rdma_max_shadow_mib, 1024,
          "verbs: pinned host memory (MiB) that incoming transfers into such GPU "
          "memory may land in at once; a transfer beyond it is refused.");
ABSL_FLAG(int, rdma_max_qps_per_nic, 64,
          "verbs: RC queue pairs one NIC holds over all peers (1-4096, at least "
          "--qps_per_nic); a peer past it is refused RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, gpu, "auto",
          "GPU paths: auto (on where the CUDA driver finds GPUs; topology GPU i is CUDA "
          "device i) or off.");
ABSL_FLAG(std::string, relay_stage, "d2",
          "How GPU chunks enter a relay slot: d1 (copy kernel on the source GPU) or d2 "
          "(copy-engine peer copy).");
ABSL_FLAG(uint64_t, relay_cap_mib, 512, "Relay memory per GPU, at most (MiB).");
ABSL_FLAG(uint64_t, relay_min_free_mib, 2048,
          "Below this much free memory on a GPU, its relay slots are given back and its "
          "NICs lend nothing (MiB).");
ABSL_FLAG(int, relay_idle_ms, 2000, "Relay slots idle this long are freed.");
ABSL_FLAG(std::string, peer_discovery, "static",
          "static (the --peer list only) or kubernetes (also the endpoints of "
          "--k8s_service, watched on the API server).");
ABSL_FLAG(std::string, k8s_service, "",
          "kubernetes discovery: the agents' headless Service.");
ABSL_FLAG(std::string, k8s_namespace, "",
          "kubernetes discovery: its namespace; default: this pod's.");
ABSL_FLAG(std::string, k8s_api_server, "",
          "kubernetes discovery: https://host:port; default: the in-cluster address.");
ABSL_FLAG(std::string, k8s_token_file,
          "/var/run/secrets/kubernetes.io/serviceaccount/token",
          "kubernetes discovery: the service-account token.");
ABSL_FLAG(std::string, k8s_ca_file,
          "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
          "kubernetes discovery: the API server's CA.");
ABSL_FLAG(std::string, k8s_address_family, "auto",
          "kubernetes discovery, dual stack: the family of peers' addresses, ipv4 or "
          "ipv6 (the other only for a peer without one); auto: IPv6 if --listen's "
          "host is an IPv6 literal, else IPv4.");
ABSL_FLAG(uint32_t, k8s_watch_backoff_min_ms, 1000,
          "kubernetes discovery: after a watch ends (renewed, gone or failed), or a list "
          "fails, a pause drawn from [b/2, b] before the next request; b starts here, "
          "doubles each time, and starts again after a watch that lived "
          "--k8s_watch_backoff_max_ms.");
ABSL_FLAG(uint32_t, k8s_watch_backoff_max_ms, 30000,
          "kubernetes discovery: the largest b of --k8s_watch_backoff_min_ms.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) of this agent: its identity, a URI SAN "
          "spiffe://fuselink/node/<node> under the default policy. Re-read when it "
          "changes.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle: every client and peer certificate must chain to it.");
ABSL_FLAG(uint32_t, tls_refresh_s, 10,
          "How often the TLS files are checked for a rotated certificate.");
ABSL_FLAG(bool, plaintext, false,
          "Serve and call without TLS and without authentication: anyone who reaches "
          "the ports may do anything. For a trusted test network only.");
ABSL_FLAG(bool, accept_forwarded, false,
          "Run the transfers other agents forward here (Peer.ForwardTransfer: a router "
          "or decode side asked them for a transfer out of this node), checked as the "
          "requester they name. A forwarding agent may name any requester, so this "
          "trusts every peer agent to read this node's tensors as any router would; "
          "off, forwarded requests are PERMISSION_DENIED (FORWARDING_OFF).");
ABSL_FLAG(std::string, access_policy, "",
          "Identities and their roles, a fuselink.v1.AccessPolicy in JSON; empty: the "
          "default policy (docs/security.md).");
ABSL_FLAG(std::string, ready_file, "",
          "Write the bound addresses here as JSON once serving.");

namespace fuselink::services {
namespace {

// Threads of any one pool, at most (--prepare_threads and the services' pools).
constexpr uint32_t kMaxPoolThreads = 256;

// The shares per identity: each at least 1, the tensors' at most the registry's bound.
// A transfer share over --max_transfers is allowed: only --max_transfers bounds it then.
absl::Status CheckShares(const NodeOptions& options) {
  if (options.engine.max_active_transfers_per_requester == 0) {
    return absl::InvalidArgumentError("--max_transfers_per_router must be at least 1");
  }
  if (options.shares.max_tensors == 0 ||
      options.shares.max_tensors > memory::kMaxTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_tensors_per_engine must be 1 to ", memory::kMaxTensors));
  }
  // Under kMaxLayoutParts it also refuses single tensors with more parts than that.
  if (options.shares.max_layout_parts == 0) {
    return absl::InvalidArgumentError("--max_layout_parts_per_engine must be at least 1");
  }
  if (options.max_watches_per_identity == 0) {
    return absl::InvalidArgumentError("--max_watches_per_identity must be at least 1");
  }
  return absl::OkStatus();
}

// The node's topology as --topology says: discovered, emulated or from a file.
absl::StatusOr<topo::Topology> MakeTopology(bool gpus_on) {
  const std::string source = absl::GetFlag(FLAGS_topology);
  topo::Topology topology;
  if (source == "emulated") {
    topology = topo::EmulatedTopology(absl::GetFlag(FLAGS_nics).value_or(4),
                                      absl::GetFlag(FLAGS_loopback_net).value_or(1), 0);
  } else if (source == "discover") {
    // Flags of an emulated node on a discovered one would be silently ignored: a
    // script that relied on the old emulated default must say --topology=emulated.
    if (absl::GetFlag(FLAGS_nics) || absl::GetFlag(FLAGS_loopback_net)) {
      return absl::InvalidArgumentError(
          "--nics and --loopback_net describe an emulated node: add --topology=emulated "
          "(the default is --topology=discover)");
    }
    absl::StatusOr<topo::Topology> found =
        topo::NodeDiscovery(absl::GetFlag(FLAGS_sysfs_root),
                            absl::GetFlag(FLAGS_exclude_nics), gpus_on)
            .Run();
    if (!found.ok()) return found.status();
    if (absl::Status s = topo::RequireDataNics(*found); !s.ok()) return s;
    topology = *std::move(found);
  } else if (source.empty()) {  // once the emulated default; now a mistake
    return absl::InvalidArgumentError(
        "--topology is empty: give discover, emulated or a topology file");
  } else {
    return topo::LoadTopologyFile(source);  // ./discover is a file named discover
  }
  if (absl::Status s = topo::ValidateTopology(topology); !s.ok()) return s;
  return topology;
}

// The node, its topology and its --peer list.
absl::Status ReadNode(NodeOptions& options) {
  options.node = absl::GetFlag(FLAGS_node);
  if (absl::Status s = memory::ValidateName(options.node); !s.ok()) {
    return absl::InvalidArgumentError("--node: a name of [A-Za-z0-9._/-] is required");
  }
  if (absl::StatusOr<topo::Topology> t = MakeTopology(absl::GetFlag(FLAGS_gpu) != "off");
      t.ok()) {
    options.topology = *std::move(t);
  } else {
    return t.status();
  }
  for (const std::string& p : absl::GetFlag(FLAGS_peer)) {
    std::vector<std::string> kv = absl::StrSplit(p, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty() || kv[1].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer '", p, "': want name=host:port"));
    }
    options.peers[kv[0]] = kv[1];
  }
  return absl::OkStatus();
}

// The scheduler's depths and the fabric: TCP connections, verbs QPs, GPU paths.
absl::Status ReadFabric(NodeOptions& options) {
  options.policy = absl::GetFlag(FLAGS_policy);
  options.limits.direct_depth = absl::GetFlag(FLAGS_direct_depth);
  options.limits.borrow_depth = absl::GetFlag(FLAGS_borrow_depth);
  options.connections_per_nic = absl::GetFlag(FLAGS_connections_per_nic);
  options.fabric_stall_timeout_ms = absl::GetFlag(FLAGS_fabric_stall_timeout_ms);
  options.fabric_ack_timeout_ms = absl::GetFlag(FLAGS_fabric_ack_timeout_ms);
  options.fabric_connections_per_peer = absl::GetFlag(FLAGS_fabric_connections_per_peer);
  for (const auto& [name, ms] :
       {std::pair{"--fabric_stall_timeout_ms", options.fabric_stall_timeout_ms},
        std::pair{"--fabric_ack_timeout_ms", options.fabric_ack_timeout_ms}}) {
    if (ms < 1 || ms > 3'600'000) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be 1 to 3600000"));
    }
  }
  options.qps_per_nic = absl::GetFlag(FLAGS_qps_per_nic);
  options.rdma_traffic_class = absl::GetFlag(FLAGS_rdma_traffic_class);
  options.rdma_service_level = absl::GetFlag(FLAGS_rdma_service_level);
  if (options.rdma_traffic_class < 0 || options.rdma_traffic_class > 255) {
    return absl::InvalidArgumentError("--rdma_traffic_class must be 0 to 255");
  }
  if (options.rdma_service_level < 0 || options.rdma_service_level > 15) {
    return absl::InvalidArgumentError("--rdma_service_level must be 0 to 15");
  }
  if (std::optional<v1::PathClass> c =
          topo::ParsePathClass(absl::GetFlag(FLAGS_gpudirect_max_class))) {
    options.gpudirect_max_class = *c;
  } else {
    return absl::InvalidArgumentError(
        "--gpudirect_max_class must be PIX, PXB, PHB, NODE or SYS");
  }
  options.rdma_staging_slots = absl::GetFlag(FLAGS_rdma_staging_slots);
  if (options.rdma_staging_slots < 1 || options.rdma_staging_slots > 4096) {
    return absl::InvalidArgumentError("--rdma_staging_slots must be 1 to 4096");
  }
  const uint64_t shadow_mib = absl::GetFlag(FLAGS_rdma_max_shadow_mib);
  if (shadow_mib < 1 || shadow_mib > (uint64_t{1} << 24)) {
    return absl::InvalidArgumentError("--rdma_max_shadow_mib must be 1 to 16777216");
  }
  options.rdma_max_shadow_bytes = shadow_mib << 20;
  options.rdma_max_qps_per_nic = absl::GetFlag(FLAGS_rdma_max_qps_per_nic);
  if (options.rdma_max_qps_per_nic < std::max(1, options.qps_per_nic) ||
      options.rdma_max_qps_per_nic > 4096) {
    return absl::InvalidArgumentError(
        "--rdma_max_qps_per_nic must be --qps_per_nic to 4096");
  }
  options.transport = absl::GetFlag(FLAGS_transport);
  return absl::OkStatus();
}

// The source engine: chunks, windows, transfers, shares, thread pools.
absl::Status ReadEngine(NodeOptions& options) {
  options.engine.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  options.engine.window_chunks = absl::GetFlag(FLAGS_window_chunks);
  options.engine.max_active_transfers = absl::GetFlag(FLAGS_max_transfers);
  options.engine.max_active_transfers_per_requester =
      absl::GetFlag(FLAGS_max_transfers_per_router);
  options.shares.max_tensors = absl::GetFlag(FLAGS_max_tensors_per_engine);
  options.shares.max_layout_parts = absl::GetFlag(FLAGS_max_layout_parts_per_engine);
  options.max_watches_per_identity = absl::GetFlag(FLAGS_max_watches_per_identity);
  if (absl::Status s = CheckShares(options); !s.ok()) return s;
  {
    const uint32_t prepare = absl::GetFlag(FLAGS_prepare_threads);
    const uint32_t per_target = absl::GetFlag(FLAGS_prepare_threads_per_target);
    const uint32_t queue = absl::GetFlag(FLAGS_prepare_queue_per_target);
    const uint32_t incoming = absl::GetFlag(FLAGS_incoming_prepare_threads);
    const uint32_t per_source = absl::GetFlag(FLAGS_incoming_prepares_per_source);
    const uint32_t incoming_all = absl::GetFlag(FLAGS_incoming_prepares_pending);
    const uint32_t registering = absl::GetFlag(FLAGS_register_threads);
    const uint32_t per_caller = absl::GetFlag(FLAGS_registrations_per_caller);
    const uint32_t registering_all = absl::GetFlag(FLAGS_registrations_pending);
    auto threads_ok = [](uint32_t n) { return n >= 1 && n <= kMaxPoolThreads; };
    if (!threads_ok(prepare) || !threads_ok(incoming) || !threads_ok(registering) ||
        per_target == 0 || per_target > prepare || (queue != 0 && queue < per_target) ||
        per_source == 0 || incoming_all < per_source || per_caller == 0 ||
        registering_all < per_caller) {
      return absl::InvalidArgumentError(
          "--prepare_threads, --incoming_prepare_threads and --register_threads must "
          "be 1 to 256; --prepare_threads_per_target 1 to --prepare_threads and at "
          "most --prepare_queue_per_target; --incoming_prepares_per_source and "
          "--registrations_per_caller at least 1 and at most their totals");
    }
    options.engine.prepare_threads = static_cast<int>(prepare);
    options.engine.prepare_threads_per_target = static_cast<int>(per_target);
    options.engine.prepare_queue_per_target = queue;
    options.incoming_prepares.threads = static_cast<int>(incoming);
    options.incoming_prepares.pending_per_key = per_source;
    options.incoming_prepares.pending_total = incoming_all;
    options.registrations.threads = static_cast<int>(registering);
    options.registrations.pending_per_key = per_caller;
    options.registrations.pending_total = registering_all;
  }
  return absl::OkStatus();
}

// The drain bound, the target's landing, CUDA imports, the GPU relay.
absl::Status ReadLandingAndRelay(NodeOptions& options) {
  const uint32_t drain_ms = absl::GetFlag(FLAGS_transfer_drain_timeout_ms);
  if (drain_ms < 1 || drain_ms > 3'600'000) {
    return absl::InvalidArgumentError("--transfer_drain_timeout_ms must be 1 to 3600000");
  }
  options.engine.drain_bound = absl::Milliseconds(drain_ms);
  options.landing.max_per_source = absl::GetFlag(FLAGS_incoming_per_source);
  options.landing.start_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_incoming_start_timeout_ms));
  const uint32_t idle_ms = absl::GetFlag(FLAGS_incoming_idle_timeout_ms);
  if (idle_ms < 1000 || idle_ms > 3'600'000) {
    return absl::InvalidArgumentError(
        "--incoming_idle_timeout_ms must be 1000 to 3600000");
  }
  options.landing.idle_timeout = absl::Milliseconds(idle_ms);
  options.ipc_close_wait = absl::Milliseconds(absl::GetFlag(FLAGS_ipc_close_wait_ms));
  if (absl::GetFlag(FLAGS_ipc_close_wait_ms) == 0 ||
      absl::GetFlag(FLAGS_ipc_close_wait_ms) > 60000) {
    return absl::InvalidArgumentError("--ipc_close_wait_ms must be 1 to 60000");
  }
  if (options.landing.max_per_source == 0 ||
      options.landing.max_per_source > transfer::kMaxIncoming) {
    return absl::InvalidArgumentError("--incoming_per_source must be 1 to 4096");
  }
  options.gpu = absl::GetFlag(FLAGS_gpu);
  if (options.gpu != "auto" && options.gpu != "off") {
    return absl::InvalidArgumentError("--gpu must be auto or off");
  }
  absl::StatusOr<relay::StageMode> stage =
      relay::ParseStageMode(absl::GetFlag(FLAGS_relay_stage));
  if (!stage.ok()) return stage.status();
  options.gpu_relay.mode = *stage;
  options.gpu_relay.slot_bytes = options.engine.chunk_bytes;
  options.gpu_relay.cap_bytes_per_gpu = absl::GetFlag(FLAGS_relay_cap_mib) << 20;
  options.gpu_relay.min_free_bytes = absl::GetFlag(FLAGS_relay_min_free_mib) << 20;
  options.gpu_relay.idle = absl::Milliseconds(absl::GetFlag(FLAGS_relay_idle_ms));
  if (options.engine.chunk_bytes < transfer::kMinChunkBytes ||
      options.engine.chunk_bytes > transfer::kMaxChunkBytes ||
      options.engine.window_chunks == 0 || options.engine.window_chunks > 1024 ||
      options.limits.direct_depth == 0 || options.limits.direct_depth > 1024 ||
      options.limits.borrow_depth > 1024) {
    return absl::InvalidArgumentError(
        "--chunk_bytes must be 4 KiB to 64 MiB, --window_chunks and --direct_depth 1 to "
        "1024, --borrow_depth 0 to 1024");
  }
  return absl::OkStatus();
}

// Foreign traffic on the NICs.
absl::Status ReadForeign(NodeOptions& options) {
  options.foreign.busy_bytes_per_s = absl::GetFlag(FLAGS_foreign_busy_bytes_per_s);
  const double header_pct = absl::GetFlag(FLAGS_foreign_overhead_pct);
  const double ack_pct = absl::GetFlag(FLAGS_foreign_ack_overhead_pct);
  options.foreign.header_overhead_fraction = header_pct / 100;
  options.foreign.ack_overhead_fraction = ack_pct / 100;
  options.foreign.hold = absl::Milliseconds(absl::GetFlag(FLAGS_foreign_hold_ms));
  options.foreign_check = absl::Milliseconds(absl::GetFlag(FLAGS_foreign_check_ms));
  // Written so that NaN fails too: every comparison with it is false.
  const auto percent = [](double pct) { return pct >= 0 && pct <= 100; };
  if (options.foreign.busy_bytes_per_s < -1 || !percent(header_pct) ||
      !percent(ack_pct) || absl::GetFlag(FLAGS_foreign_check_ms) == 0 ||
      absl::GetFlag(FLAGS_foreign_check_ms) > 1000) {
    return absl::InvalidArgumentError(
        "--foreign_busy_bytes_per_s must be -1 or more, --foreign_overhead_pct and "
        "--foreign_ack_overhead_pct 0 to 100, --foreign_check_ms 1 to 1000");
  }
  return absl::OkStatus();
}

// Access: the policy, forwarding, TLS or --plaintext.
absl::Status ReadSecurity(AgentConfig& config) {
  NodeOptions& options = config.node;
  const bool plaintext = absl::GetFlag(FLAGS_plaintext);
  options.open_access = plaintext;
  options.accept_forwarded = absl::GetFlag(FLAGS_accept_forwarded);
  if (std::string path = absl::GetFlag(FLAGS_access_policy); !path.empty()) {
    absl::StatusOr<security::Policy> policy = security::Policy::LoadFile(path);
    if (!policy.ok()) return policy.status();
    options.access_policy = *std::move(policy);
  }
  security::TlsFiles files{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                           absl::GetFlag(FLAGS_tls_ca),
                           absl::GetFlag(FLAGS_tls_refresh_s)};
  const bool any_tls =
      !files.cert_file.empty() || !files.key_file.empty() || !files.ca_file.empty();
  if (plaintext && any_tls) {
    return absl::InvalidArgumentError(
        "--plaintext and --tls_* contradict each other: give one or the other");
  }
  if (!plaintext && !any_tls) {
    return absl::InvalidArgumentError(
        "mutual TLS needs --tls_cert, --tls_key and --tls_ca (scripts/certs.sh makes "
        "them); --plaintext runs without any authentication");
  }
  if (!plaintext) config.tls = std::move(files);
  return absl::OkStatus();
}

// The metrics endpoint, the handle socket, the gRPC server.
absl::Status ReadEdges(AgentConfig& config) {
  NodeOptions& options = config.node;
  config.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  config.metrics.auth_queue_depth = absl::GetFlag(FLAGS_metrics_auth_queue_depth);
  if (config.metrics.auth_queue_depth < 1 ||
      config.metrics.auth_queue_depth > http::kMaxAuthQueueDepth) {
    return absl::InvalidArgumentError("--metrics_auth_queue_depth must be 1 to 1024");
  }
  if (const std::string file = absl::GetFlag(FLAGS_metrics_web_config); !file.empty()) {
    absl::StatusOr<http::WebConfig> web = http::LoadWebConfig(file);
    if (!web.ok()) return web.status();
    config.metrics.web_config = *std::move(web);
  }

  config.handle_socket = absl::GetFlag(FLAGS_handle_socket);
  if (config.handle_socket.empty()) {
    absl::StatusOr<std::string> path =
        DefaultSocketPath(absl::GetFlag(FLAGS_runtime_dir), options.node);
    if (!path.ok()) return path.status();
    config.handle_socket = *std::move(path);
  }

  config.listen = absl::GetFlag(FLAGS_listen);
  config.grpc_max_streams = absl::GetFlag(FLAGS_grpc_max_streams_per_connection);
  if (config.grpc_max_streams == 0 || config.grpc_max_streams > (1u << 20)) {
    return absl::InvalidArgumentError(
        "--grpc_max_streams_per_connection must be 1 to 1048576");
  }
  return absl::OkStatus();
}

// Peer discovery: static, or Kubernetes.
absl::Status ReadKubernetes(AgentConfig& config) {
  NodeOptions& options = config.node;
  if (absl::GetFlag(FLAGS_peer_discovery) == "kubernetes") {
    K8sDiscoveryOptions k8s;
    k8s.api_server = absl::GetFlag(FLAGS_k8s_api_server);
    k8s.token_file = absl::GetFlag(FLAGS_k8s_token_file);
    k8s.ca_file = absl::GetFlag(FLAGS_k8s_ca_file);
    k8s.service = absl::GetFlag(FLAGS_k8s_service);
    k8s.namespace_name = absl::GetFlag(FLAGS_k8s_namespace);
    if (k8s.namespace_name.empty()) {
      std::ifstream ns("/var/run/secrets/kubernetes.io/serviceaccount/namespace");
      std::getline(ns, k8s.namespace_name);
    }
    k8s.self = options.node;
    if (const std::string family = absl::GetFlag(FLAGS_k8s_address_family);
        family == "ipv4" || family == "ipv6") {
      k8s.prefer = family == "ipv6" ? AddressFamily::kIPv6 : AddressFamily::kIPv4;
    } else if (family == "auto") {
      k8s.prefer = FamilyOfListen(config.listen);
    } else {
      return absl::InvalidArgumentError(
          "--k8s_address_family must be auto, ipv4 or ipv6");
    }
    k8s.backoff_min = absl::Milliseconds(absl::GetFlag(FLAGS_k8s_watch_backoff_min_ms));
    k8s.backoff_max = absl::Milliseconds(absl::GetFlag(FLAGS_k8s_watch_backoff_max_ms));
    config.kubernetes = std::move(k8s);
  } else if (absl::GetFlag(FLAGS_peer_discovery) != "static") {
    return absl::InvalidArgumentError("--peer_discovery must be static or kubernetes");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AgentConfig> ConfigFromFlags() {
  AgentConfig config;
  NodeOptions& options = config.node;
  FL_RETURN_IF_ERROR(ReadNode(options));
  FL_RETURN_IF_ERROR(ReadFabric(options));
  FL_RETURN_IF_ERROR(ReadEngine(options));
  FL_RETURN_IF_ERROR(ReadLandingAndRelay(options));
  FL_RETURN_IF_ERROR(ReadForeign(options));
  FL_RETURN_IF_ERROR(ReadSecurity(config));
  FL_RETURN_IF_ERROR(ReadEdges(config));
  FL_RETURN_IF_ERROR(ReadKubernetes(config));
  config.ready_file = absl::GetFlag(FLAGS_ready_file);
  return config;
}

}  // namespace fuselink::services
