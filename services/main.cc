// fuselink-agent: the per-node daemon. Flags may also come from a file
// (--flagfile=agent.flags, one --flag=value a line); services/flags.h reads them. main
// wires: the metrics endpoint, the node, the handle socket, the gRPC services,
// discovery, the ready file (services/startup.h, services/ready_file.h); then waits
// for SIGINT or SIGTERM and takes them down in order.
#include <pthread.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "services/flags.h"
#include "services/grpc/agent_service.h"
#include "services/grpc/peer_service.h"
#include "services/handle_socket/socket.h"
#include "services/metrics/metrics.h"
#include "services/startup.h"

// The release the binary belongs to; the image and the Helm chart carry the same.
#ifndef FUSELINK_VERSION
#define FUSELINK_VERSION "0.1.0"
#endif

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "fuselink-agent: %s\n", status.ToString().c_str());
  return 1;
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

// The process before the agent: flags parsed, abseil's deadlock detection off in
// release builds, SIGINT and SIGTERM blocked in every thread (each inherits the
// mask) for main's sigwait, SIGPIPE ignored. Returns the stop signals.
sigset_t SetUpProcess(int argc, char** argv) {
  SetUsage();
  absl::ParseCommandLine(argc, argv);
#ifdef NDEBUG
  // abseil's lock-cycle detection costs about half of an idle agent's CPU; debug
  // builds and the unit tests keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return stop_signals;
}

}  // namespace

int main(int argc, char** argv) {
  const sigset_t stop_signals = SetUpProcess(argc, argv);
  using namespace fuselink::services;
  absl::StatusOr<AgentConfig> config = ConfigFromFlags();
  if (!config.ok()) return Fail(config.status());
  absl::StatusOr<std::unique_ptr<fuselink::security::TlsCredentials>> tls =
      MakeTls(*config);
  if (!tls.ok()) return Fail(tls.status());
  absl::StatusOr<std::unique_ptr<Metrics>> metrics =
      Metrics::Start(config->metrics_listen, config->metrics);
  if (!metrics.ok()) return Fail(metrics.status());
  if (*tls != nullptr) (*metrics)->AttachTls(tls->get());
  absl::StatusOr<std::unique_ptr<Node>> node = Node::Create(config->node, metrics->get());
  if (!node.ok()) return Fail(node.status());
  (*metrics)->Attach(node->get(), (*node)->nic_labels());
  absl::StatusOr<std::unique_ptr<HandleSocket>> handles = HandleSocket::Listen(
      config->handle_socket, &(*node)->fd_tokens(), &(*node)->handle_socket_counters());
  if (!handles.ok()) return Fail(handles.status());

  AgentService agent_service(AgentParts(**node));
  PeerService peer_service(PeerParts(**node));
  int grpc_port = 0;
  absl::StatusOr<std::unique_ptr<grpc::Server>> server =
      ServeGrpc(*config, tls->get(), {&agent_service, &peer_service}, grpc_port);
  if (!server.ok()) return Fail(server.status());
  const ReadyInfo served = Served(*config, grpc_port, (*metrics)->port());
  PrintBanner(*config, served, **node);
  absl::StatusOr<std::unique_ptr<K8sDiscovery>> discovery =
      FollowPeers(*config, &(*node)->peers());
  if (!discovery.ok()) return Fail(discovery.status());
  (*metrics)->AttachDiscovery(discovery->get());
  AnnounceReady(config->ready_file, served);

  int signal = 0;
  sigwait(&stop_signals, &signal);
  // Within 2 s: running transfers fail SHUTTING_DOWN and their streams, and every
  // watcher, get their last events; new calls are refused (UNAVAILABLE); then the
  // data plane goes, the metrics stop reading it first.
  std::printf("fuselink-agent node=%s stopping\n", served.node.c_str());
  std::fflush(stdout);
  (*metrics)->AttachDiscovery(nullptr);
  discovery->reset();  // its callback uses the node's peers
  (*node)->StopTransfers();
  (*node)->watch_hub().Close();
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  handles->reset();
  (*metrics)->Detach();
  node->reset();
  return 0;
}
