#include "services/startup.h"

#include <cstdio>
#include <functional>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/topo/render.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace fuselink::services {
namespace {

// Peers named by --peer stay as given; discovered ones come and go with their
// endpoints.
std::function<void(const PeerSet&)> FollowDiscovery(
    peer::PeerDirectory* peers, std::map<std::string, std::string> fixed) {
  return [peers, fixed = std::move(fixed)](const PeerSet& found) {
    for (const auto& [name, address] : peers->Peers()) {
      if (!found.contains(name) && !fixed.contains(name) && peers->RemovePeer(name)) {
        std::printf("fuselink-agent: peer %s left\n", name.c_str());
      }
    }
    for (const auto& [name, address] : found) {
      if (!fixed.contains(name) && peers->SetPeer(name, address)) {
        std::printf("fuselink-agent: peer %s at %s\n", name.c_str(), address.c_str());
      }
    }
    std::fflush(stdout);
  };
}

}  // namespace

absl::StatusOr<std::unique_ptr<security::TlsCredentials>> MakeTls(AgentConfig& config) {
  if (!config.tls) return nullptr;
  absl::StatusOr<std::unique_ptr<security::TlsCredentials>> tls =
      security::TlsCredentials::Create(*config.tls);
  if (!tls.ok()) return tls.status();
  config.node.peer_credentials =
      [tls = tls->get(), policy = config.node.access_policy](const std::string& node) {
        return tls->ToPeer(policy.IdentityOf(node));
      };
  return tls;
}

absl::StatusOr<std::unique_ptr<grpc::Server>> ServeGrpc(
    const AgentConfig& config, security::TlsCredentials* tls,
    std::initializer_list<grpc::Service*> services, int& port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  port = 0;
  builder.AddListeningPort(
      config.listen, tls ? tls->Server() : grpc::InsecureServerCredentials(), &port);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(config.grpc_max_streams));
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", config.listen));
  }
  return server;
}

ReadyInfo Served(const AgentConfig& config, int grpc_port, int metrics_port) {
  const std::string host = config.listen.substr(0, config.listen.rfind(':'));
  return {
      .node = config.node.node,
      .grpc_address = absl::StrCat(host, ":", grpc_port),
      .metrics_url = absl::StrCat(config.metrics.web_config.tls ? "https://" : "http://",
                                  host, ":", metrics_port, "/metrics"),
      .handle_socket = config.handle_socket};
}

void PrintBanner(const AgentConfig& config, const ReadyInfo& served, const Node& node) {
  const bool plaintext = !config.tls;
  std::printf(
      "fuselink-agent node=%s grpc=%s metrics=%s handle_socket=%s transport=%s nics=%d "
      "policy=%s security=%s\n%s\n",
      served.node.c_str(), served.grpc_address.c_str(), served.metrics_url.c_str(),
      served.handle_socket.c_str(), node.topology().transport().c_str(),
      node.topology().nics_size(), config.node.policy.c_str(),
      plaintext ? "plaintext" : "mtls", node.gpu_status().c_str());
  if (plaintext) {
    std::fprintf(stderr,
                 "fuselink-agent: WARNING: --plaintext: no TLS and no authentication; "
                 "anyone who reaches %s may register, move and read every tensor\n",
                 served.grpc_address.c_str());
  }
  if (node.gpu() != nullptr) std::printf("%s", node.gpu()->Describe().c_str());
  if (node.topology().source() == "discovered") {
    std::printf("%s", topo::RenderTopology(node.topology()).c_str());
  }
  std::printf("%s", node.foreign().Describe().c_str());
  std::fflush(stdout);
}

void AnnounceReady(const std::string& path, const ReadyInfo& served) {
  if (path.empty()) return;
  if (absl::Status s = WriteReadyFile(path, served); !s.ok()) {
    std::fprintf(stderr, "fuselink-agent: no ready file: %s\n", s.ToString().c_str());
  }
}

absl::StatusOr<std::unique_ptr<K8sDiscovery>> FollowPeers(const AgentConfig& config,
                                                          peer::PeerDirectory* peers) {
  if (!config.kubernetes) return nullptr;
  return K8sDiscovery::Start(*config.kubernetes,
                             FollowDiscovery(peers, config.node.peers));
}

}  // namespace fuselink::services
