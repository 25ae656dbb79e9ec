// The steps of fuselink-agent's start that are more than wiring, each one call for
// services/main.cc: the TLS credentials, the gRPC server, the banner, Kubernetes
// discovery feeding the node's peers. Each runs once, on the main thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/node/node.h"
#include "agent/security/credentials.h"
#include "grpcpp/grpcpp.h"
#include "services/discovery/k8s_discovery.h"
#include "services/flags.h"
#include "services/ready_file.h"

namespace fuselink::services {

// The credentials --tls_* name (null with --plaintext), and the node's calls to its
// peers made with them: `config.node.peer_credentials` is set, and holds the returned
// credentials, which must outlive the node.
absl::StatusOr<std::unique_ptr<security::TlsCredentials>> MakeTls(AgentConfig& config);

// The gRPC server on config.listen with `services`, health and reflection; `port` is
// the one it got. UNAVAILABLE when it cannot listen.
absl::StatusOr<std::unique_ptr<grpc::Server>> ServeGrpc(
    const AgentConfig& config, security::TlsCredentials* tls,
    std::initializer_list<grpc::Service*> services, int& port);

// Where this agent serves: its gRPC address from the port it got, its /metrics URL.
ReadyInfo Served(const AgentConfig& config, int grpc_port, int metrics_port);

// The start-up banner on stdout (what serves where, the transport, the GPUs, a
// discovered topology, the foreign-traffic watch) and, with --plaintext, a warning on
// stderr.
void PrintBanner(const AgentConfig& config, const ReadyInfo& served, const Node& node);

// Writes the ready file (services/ready_file.h) to `path`; nothing when `path` is
// empty. A file that cannot be written is said on stderr: the agent serves on.
void AnnounceReady(const std::string& path, const ReadyInfo& served);

// Kubernetes discovery (config.kubernetes) keeping `peers` to the endpoints it finds:
// peers named by --peer stay as given, discovered ones come and go. Null without it.
// `peers` outlives the discovery.
absl::StatusOr<std::unique_ptr<K8sDiscovery>> FollowPeers(const AgentConfig& config,
                                                          peer::PeerDirectory* peers);

}  // namespace fuselink::services
