// The agent's flags read into AgentConfig (flags.h), one function a concern; the
// flags themselves, their defaults and help are flags.cc's. Reading parses: a value
// that is not one of a flag's words, or a file that does not load, is refused here.
// Ranges are the options structs' own (their Validate), checked once all is read;
// kFlagOfField names the flag behind each field, so that a refusal names the flag.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/common/options.h"
#include "agent/common/status_macros.h"
#include "agent/topo/affinity.h"
#include "agent/topo/discovery.h"
#include "services/flags.h"
#include "services/flags_internal.h"
#include "services/handle_socket/socket.h"

namespace fuselink::services {
namespace {

// The flag that fills each field of AgentConfig whose Validate may refuse it, by the
// field's path there. A field that is not here is set by no flag.
constexpr std::pair<absl::string_view, absl::string_view> kFlagOfField[] = {
    {"limits.direct_depth", "--direct_depth"},
    {"limits.borrow_depth", "--borrow_depth"},
    {"fabric_stall_timeout_ms", "--fabric_stall_timeout_ms"},
    {"fabric_ack_timeout_ms", "--fabric_ack_timeout_ms"},
    {"rdma_traffic_class", "--rdma_traffic_class"},
    {"rdma_service_level", "--rdma_service_level"},
    {"rdma_staging_slots", "--rdma_staging_slots"},
    {"rdma_staging_slots_per_peer", "--rdma_staging_slots_per_peer"},
    {"rdma_max_shadow_bytes", "--rdma_max_shadow_mib"},
    {"rdma_max_qps_per_nic", "--rdma_max_qps_per_nic"},
    {"engine.chunk_bytes", "--chunk_bytes"},
    {"engine.window_chunks", "--window_chunks"},
    {"engine.max_active_transfers", "--max_transfers"},
    {"engine.max_active_transfers_per_requester", "--max_transfers_per_router"},
    {"engine.prepare_threads", "--prepare_threads"},
    {"engine.prepare_threads_per_target", "--prepare_threads_per_target"},
    {"engine.prepare_queue_per_target", "--prepare_queue_per_target"},
    {"engine.drain_bound", "--transfer_drain_timeout_ms"},
    {"landing.idle_timeout", "--incoming_idle_timeout_ms"},
    {"landing.max_per_source", "--incoming_per_source"},
    {"shares.max_tensors", "--max_tensors_per_engine"},
    {"shares.max_layout_parts", "--max_layout_parts_per_engine"},
    {"foreign.busy_bytes_per_s", "--foreign_busy_bytes_per_s"},
    {"foreign.header_overhead_fraction", "--foreign_overhead_pct"},
    {"foreign.ack_overhead_fraction", "--foreign_ack_overhead_pct"},
    {"incoming_prepares.threads", "--incoming_prepare_threads"},
    {"incoming_prepares.pending_per_key", "--incoming_prepares_per_source"},
    {"incoming_prepares.pending_total", "--incoming_prepares_pending"},
    {"registrations.threads", "--register_threads"},
    {"registrations.pending_per_key", "--registrations_per_caller"},
    {"registrations.pending_total", "--registrations_pending"},
    {"max_watches_per_identity", "--max_watches_per_identity"},
    {"gpu", "--gpu"},
    {"gpu_copy_timeout_ms", "--gpu_copy_timeout_ms"},
    {"foreign_check", "--foreign_check_ms"},
    {"ipc_close_wait", "--ipc_close_wait_ms"},
    {"metrics.auth_queue_depth", "--metrics_auth_queue_depth"},
    {"grpc_max_streams", "--grpc_max_streams_per_connection"},
};

// A refusal of AgentConfig::Validate said in terms of flags: "--window_chunks must be
// 1 to 1024, not 0" where the flag is the field's name, else the flag first and the
// field after it ("--foreign_overhead_pct: foreign.header_overhead_fraction must be
// 0 to 1, not 1.5"), the field then in the struct's own unit.
absl::Status NamingTheFlag(const absl::Status& status) {
  const std::string field = FieldOf(status);
  for (const auto& [path, flag] : kFlagOfField) {
    if (path != field) continue;
    const absl::string_view want = status.message().substr(field.size());
    const absl::string_view leaf = path.substr(path.rfind('.') + 1);
    if (flag.substr(2) == leaf)
      return absl::InvalidArgumentError(absl::StrCat(flag, want));
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", status.message()));
  }
  return status;
}

// A flag's count as a field of type int; past int's range stays past the field's.
int AsInt(uint32_t n) { return static_cast<int>(std::min<uint32_t>(n, INT_MAX)); }

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
  options.qps_per_nic = absl::GetFlag(FLAGS_qps_per_nic);
  options.rdma_traffic_class = absl::GetFlag(FLAGS_rdma_traffic_class);
  options.rdma_service_level = absl::GetFlag(FLAGS_rdma_service_level);
  if (std::optional<v1::PathClass> c =
          topo::ParsePathClass(absl::GetFlag(FLAGS_gpudirect_max_class))) {
    options.gpudirect_max_class = *c;
  } else {
    return absl::InvalidArgumentError(
        "--gpudirect_max_class must be PIX, PXB, PHB, NODE or SYS");
  }
  options.rdma_staging_slots = absl::GetFlag(FLAGS_rdma_staging_slots);
  options.rdma_staging_slots_per_peer = absl::GetFlag(FLAGS_rdma_staging_slots_per_peer);
  // MiB to bytes, where a value past 2^44 MiB stays past the field's range.
  const uint64_t shadow_mib = absl::GetFlag(FLAGS_rdma_max_shadow_mib);
  options.rdma_max_shadow_bytes =
      shadow_mib > (UINT64_MAX >> 20) ? UINT64_MAX : shadow_mib << 20;
  options.rdma_max_qps_per_nic = absl::GetFlag(FLAGS_rdma_max_qps_per_nic);
  options.transport = absl::GetFlag(FLAGS_transport);
  return absl::OkStatus();
}

// The source engine: chunks, windows, transfers, shares, thread pools.
void ReadEngine(NodeOptions& options) {
  options.engine.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  options.engine.window_chunks = absl::GetFlag(FLAGS_window_chunks);
  options.engine.max_active_transfers = absl::GetFlag(FLAGS_max_transfers);
  options.engine.max_active_transfers_per_requester =
      absl::GetFlag(FLAGS_max_transfers_per_router);
  options.shares.max_tensors = absl::GetFlag(FLAGS_max_tensors_per_engine);
  options.shares.max_layout_parts = absl::GetFlag(FLAGS_max_layout_parts_per_engine);
  options.max_watches_per_identity = absl::GetFlag(FLAGS_max_watches_per_identity);
  options.engine.prepare_threads = AsInt(absl::GetFlag(FLAGS_prepare_threads));
  options.engine.prepare_threads_per_target =
      AsInt(absl::GetFlag(FLAGS_prepare_threads_per_target));
  options.engine.prepare_queue_per_target = absl::GetFlag(FLAGS_prepare_queue_per_target);
  const int incoming = AsInt(absl::GetFlag(FLAGS_incoming_prepare_threads));
  options.incoming_prepares.threads = incoming;
  // A pool of one thread runs one source's calls one at a time.
  options.incoming_prepares.running_per_key =
      std::min(options.incoming_prepares.running_per_key, std::max(incoming, 1));
  options.incoming_prepares.pending_per_key =
      absl::GetFlag(FLAGS_incoming_prepares_per_source);
  options.incoming_prepares.pending_total =
      absl::GetFlag(FLAGS_incoming_prepares_pending);
  options.registrations.threads = AsInt(absl::GetFlag(FLAGS_register_threads));
  options.registrations.pending_per_key = absl::GetFlag(FLAGS_registrations_per_caller);
  options.registrations.pending_total = absl::GetFlag(FLAGS_registrations_pending);
}

// The drain bound, the target's landing, CUDA imports, the GPU relay.
absl::Status ReadLandingAndRelay(NodeOptions& options) {
  options.engine.drain_bound =
      absl::Milliseconds(absl::GetFlag(FLAGS_transfer_drain_timeout_ms));
  options.landing.max_per_source = absl::GetFlag(FLAGS_incoming_per_source);
  options.landing.start_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_incoming_start_timeout_ms));
  options.landing.idle_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_incoming_idle_timeout_ms));
  options.ipc_close_wait = absl::Milliseconds(absl::GetFlag(FLAGS_ipc_close_wait_ms));
  options.gpu = absl::GetFlag(FLAGS_gpu);
  options.gpu_copy_timeout_ms = absl::GetFlag(FLAGS_gpu_copy_timeout_ms);
  absl::StatusOr<relay::StageMode> stage =
      relay::ParseStageMode(absl::GetFlag(FLAGS_relay_stage));
  if (!stage.ok()) return stage.status();
  options.gpu_relay.mode = *stage;
  options.gpu_relay.slot_bytes = options.engine.chunk_bytes;
  options.gpu_relay.cap_bytes_per_gpu = absl::GetFlag(FLAGS_relay_cap_mib) << 20;
  options.gpu_relay.min_free_bytes = absl::GetFlag(FLAGS_relay_min_free_mib) << 20;
  options.gpu_relay.idle = absl::Milliseconds(absl::GetFlag(FLAGS_relay_idle_ms));
  return absl::OkStatus();
}

// Foreign traffic on the NICs.
void ReadForeign(NodeOptions& options) {
  options.foreign.busy_bytes_per_s = absl::GetFlag(FLAGS_foreign_busy_bytes_per_s);
  const double header_pct = absl::GetFlag(FLAGS_foreign_overhead_pct);
  const double ack_pct = absl::GetFlag(FLAGS_foreign_ack_overhead_pct);
  options.foreign.header_overhead_fraction = header_pct / 100;
  options.foreign.ack_overhead_fraction = ack_pct / 100;
  options.foreign.hold = absl::Milliseconds(absl::GetFlag(FLAGS_foreign_hold_ms));
  options.foreign_check = absl::Milliseconds(absl::GetFlag(FLAGS_foreign_check_ms));
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

absl::Status AgentConfig::Validate() const {
  FL_RETURN_IF_ERROR(node.Validate());
  FL_RETURN_IF_ERROR(WithinField("metrics", metrics.Validate()));
  return InRange("grpc_max_streams", grpc_max_streams, 1u, kMaxGrpcStreamsPerConnection);
}

absl::StatusOr<AgentConfig> ConfigFromFlags() {
  AgentConfig config;
  NodeOptions& options = config.node;
  FL_RETURN_IF_ERROR(ReadNode(options));
  FL_RETURN_IF_ERROR(ReadFabric(options));
  ReadEngine(options);
  FL_RETURN_IF_ERROR(ReadLandingAndRelay(options));
  ReadForeign(options);
  FL_RETURN_IF_ERROR(ReadSecurity(config));
  FL_RETURN_IF_ERROR(ReadEdges(config));
  FL_RETURN_IF_ERROR(ReadKubernetes(config));
  config.ready_file = absl::GetFlag(FLAGS_ready_file);
  FL_RETURN_IF_ERROR(NamingTheFlag(config.Validate()));
  return config;
}

}  // namespace fuselink::services
