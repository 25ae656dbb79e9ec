// The agent's flags read into AgentConfig (flags.h), one function a concern, each
// value checked against its range; the flags themselves, their defaults and help
// are flags.cc's.
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
#include "services/flags.h"
#include "services/flags_internal.h"
#include "services/handle_socket/socket.h"

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
  options.rdma_staging_slots_per_peer = absl::GetFlag(FLAGS_rdma_staging_slots_per_peer);
  if (options.rdma_staging_slots_per_peer > options.rdma_staging_slots) {
    return absl::InvalidArgumentError(
        "--rdma_staging_slots_per_peer must be 0 to --rdma_staging_slots");
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
  options.gpu_copy_timeout_ms = absl::GetFlag(FLAGS_gpu_copy_timeout_ms);
  if (options.gpu_copy_timeout_ms < 1 || options.gpu_copy_timeout_ms > 3'600'000) {
    return absl::InvalidArgumentError("--gpu_copy_timeout_ms must be 1 to 3600000");
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
