// fuselink-agent: the per-node daemon. Flags may also come from a file
// (--flagfile=agent.flags, one --flag=value a line); services/flags.h reads them. main
// wires: the metrics endpoint, the node, the handle socket, the gRPC services,
// discovery; then waits for SIGINT or SIGTERM and takes them down in order.
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/security/credentials.h"
#include "agent/topo/render.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "services/discovery/k8s_discovery.h"
#include "services/flags.h"
#include "services/grpc/agent_service.h"
#include "services/grpc/peer_service.h"
#include "services/handle_socket/socket.h"
#include "services/metrics/metrics.h"

// The release the binary belongs to; the image and the Helm chart carry the same.
#ifndef FUSELINK_VERSION
#define FUSELINK_VERSION "0.1.0"
#endif

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "fuselink-agent: %s\n", status.ToString().c_str());
  return 1;
}

// Peers named by --peer stay as given; discovered ones come and go with their
// endpoints.
std::function<void(const fuselink::services::PeerSet&)> FollowDiscovery(
    fuselink::peer::PeerDirectory* peers, std::map<std::string, std::string> fixed) {
  return [peers, fixed = std::move(fixed)](const fuselink::services::PeerSet& found) {
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

// What each service calls into, from the node that owns it.
fuselink::services::AgentServiceParts AgentParts(fuselink::services::Node& node) {
  return {.node = node.name(),
          .topology = &node.topology(),
          .guard = &node.guard(),
          .registry = &node.registry(),
          .fd_tokens = &node.fd_tokens(),
          .ipc_imports = &node.ipc_imports(),
          .gpu = node.gpu(),
          .gpu_status = node.gpu_status(),
          .engine = &node.engine(),
          .peers = &node.peers(),
          .watch_hub = &node.watch_hub(),
          .registrations = &node.registrations()};
}

fuselink::services::PeerServiceParts PeerParts(fuselink::services::Node& node) {
  return {.node = node.name(),
          .topology = &node.topology(),
          .guard = &node.guard(),
          .fabric_keys = &node.fabric_keys(),
          .peers = &node.peers(),
          .landing = &node.landing(),
          .engine = &node.engine(),
          .incoming_prepares = &node.incoming_prepares(),
          .accepts_forwarded = node.accepts_forwarded()};
}

// What --help and --version print.
void SetUsage() {
  absl::SetProgramUsageMessage("fuselink-agent --node=NAME [--peer=name=host:port,...]");
  absl::FlagsUsageConfig usage;
  usage.version_string = [] {
    return std::string("fuselink-agent " FUSELINK_VERSION "\n");
  };
  // --help lists the agent's own flags, which live in services/flags.cc (abseil's
  // default looks for a file named after the program).
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "services/flags.cc");
  };
  absl::SetFlagsUsageConfig(usage);
}

}  // namespace

int main(int argc, char** argv) {
  SetUsage();
  absl::ParseCommandLine(argc, argv);
#ifdef NDEBUG
  // abseil's lock-cycle detection costs about half of an idle agent's CPU; debug
  // builds and the unit tests keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  // SIGINT and SIGTERM are taken by sigwait below; every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  using namespace fuselink;
  absl::StatusOr<services::AgentConfig> config = services::ConfigFromFlags();
  if (!config.ok()) return Fail(config.status());
  services::NodeOptions& options = config->node;

  std::unique_ptr<security::TlsCredentials> tls;
  if (config->tls) {
    absl::StatusOr<std::unique_ptr<security::TlsCredentials>> made =
        security::TlsCredentials::Create(*config->tls);
    if (!made.ok()) return Fail(made.status());
    tls = *std::move(made);
    options.peer_credentials = [tls = tls.get(),
                                policy = options.access_policy](const std::string& node) {
      return tls->ToPeer(policy.IdentityOf(node));
    };
  }
  absl::StatusOr<std::unique_ptr<services::Metrics>> metrics =
      services::Metrics::Start(config->metrics_listen, config->metrics);
  if (!metrics.ok()) return Fail(metrics.status());
  if (tls != nullptr) (*metrics)->AttachTls(tls.get());
  absl::StatusOr<std::unique_ptr<services::Node>> node =
      services::Node::Create(options, metrics->get());
  if (!node.ok()) return Fail(node.status());
  (*metrics)->Attach(node->get(), (*node)->nic_labels());

  absl::StatusOr<std::unique_ptr<services::HandleSocket>> handles =
      services::HandleSocket::Listen(config->handle_socket, &(*node)->fd_tokens(),
                                     &(*node)->handle_socket_counters());
  if (!handles.ok()) return Fail(handles.status());

  services::AgentService agent_service(AgentParts(**node));
  services::PeerService peer_service(PeerParts(**node));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(config->listen,
                           tls ? tls->Server() : grpc::InsecureServerCredentials(),
                           &grpc_port);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(config->grpc_max_streams));
  builder.RegisterService(&agent_service);
  builder.RegisterService(&peer_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    return Fail(
        absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", config->listen)));
  }
  const std::string host = config->listen.substr(0, config->listen.rfind(':'));
  const std::string grpc_address = absl::StrCat(host, ":", grpc_port);
  const std::string metrics_url =
      absl::StrCat(config->metrics.web_config.tls ? "https://" : "http://", host, ":",
                   (*metrics)->port(), "/metrics");
  const bool plaintext = !config->tls;
  std::printf(
      "fuselink-agent node=%s grpc=%s metrics=%s handle_socket=%s transport=%s nics=%d "
      "policy=%s security=%s\n%s\n",
      options.node.c_str(), grpc_address.c_str(), metrics_url.c_str(),
      config->handle_socket.c_str(), (*node)->topology().transport().c_str(),
      (*node)->topology().nics_size(), options.policy.c_str(),
      plaintext ? "plaintext" : "mtls", (*node)->gpu_status().c_str());
  if (plaintext) {
    std::fprintf(stderr,
                 "fuselink-agent: WARNING: --plaintext: no TLS and no authentication; "
                 "anyone who reaches %s may register, move and read every tensor\n",
                 grpc_address.c_str());
  }
  if ((*node)->gpu() != nullptr) std::printf("%s", (*node)->gpu()->Describe().c_str());
  if ((*node)->topology().source() == "discovered") {
    std::printf("%s", topo::RenderTopology((*node)->topology()).c_str());
  }
  std::printf("%s", (*node)->foreign().Describe().c_str());
  std::fflush(stdout);
  std::unique_ptr<services::K8sDiscovery> discovery;
  if (config->kubernetes) {
    absl::StatusOr<std::unique_ptr<services::K8sDiscovery>> d =
        services::K8sDiscovery::Start(*config->kubernetes,
                                      FollowDiscovery(&(*node)->peers(), options.peers));
    if (!d.ok()) return Fail(d.status());
    discovery = *std::move(d);
    (*metrics)->AttachDiscovery(discovery.get());
  }
  if (!config->ready_file.empty()) {
    const std::string& ready = config->ready_file;
    std::ofstream out(ready + ".tmp");
    out << "{\"node\":\"" << options.node << "\",\"grpc\":\"" << grpc_address
        << "\",\"metrics\":\"" << metrics_url << "\",\"handle_socket\":\""
        << config->handle_socket << "\"}\n";
    out.close();
    std::rename((ready + ".tmp").c_str(), ready.c_str());
  }

  int signal = 0;
  sigwait(&stop_signals, &signal);
  // Within 2 s: running transfers fail SHUTTING_DOWN and their streams, and every
  // watcher, get their last events; new calls are refused (UNAVAILABLE); then the
  // data plane goes, the metrics stop reading it first.
  std::printf("fuselink-agent node=%s stopping\n", options.node.c_str());
  std::fflush(stdout);
  (*metrics)->AttachDiscovery(nullptr);
  discovery.reset();  // its callback uses the node's peers
  (*node)->StopTransfers();
  (*node)->watch_hub().Close();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  handles->reset();
  (*metrics)->Detach();
  node->reset();
  return 0;
}
