// The agent's command line: every flag of fuselink-agent, read and checked into one
// AgentConfig. A bad value is INVALID_ARGUMENT naming the flag and its range; nothing
// is clamped. Reading the flags starts nothing; services/main.cc wires what it says.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "agent/node/node.h"
#include "agent/security/credentials.h"
#include "services/discovery/k8s_discovery.h"
#include "services/metrics/metrics.h"

namespace fuselink::services {

// Concurrent streams one gRPC client connection may open, at most.
inline constexpr uint32_t kMaxGrpcStreamsPerConnection = 1u << 20;

struct AgentConfig {
  NodeOptions node;  // the node's parts, its topology and peers
  // The TLS files for gRPC, the peers and /metrics; none with --plaintext.
  std::optional<security::TlsFiles> tls;
  std::string listen;         // gRPC's host:port
  uint32_t grpc_max_streams;  // per client connection, 1 to kMaxGrpcStreamsPerConnection
  std::string metrics_listen;
  MetricsEndpoint metrics;
  std::string handle_socket;  // the path, the default under --runtime_dir made
  // Kubernetes discovery of peers, with --peer_discovery=kubernetes.
  std::optional<K8sDiscoveryOptions> kubernetes;
  std::string ready_file;  // empty: none

  // INVALID_ARGUMENT naming the first field out of its range: the node's by their
  // path in NodeOptions ("engine.window_chunks"), the rest as "metrics.*" and
  // "grpc_max_streams" (agent/common/options.h).
  absl::Status Validate() const;
};

// Reads the parsed flags (absl::ParseCommandLine first). Discovers or loads the
// topology (--topology) and reads the files the flags name (access policy,
// web-config), so that every error is known before anything starts.
absl::StatusOr<AgentConfig> ConfigFromFlags();

}  // namespace fuselink::services
