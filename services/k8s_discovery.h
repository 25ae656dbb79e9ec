// Peers from the Kubernetes API server: the agents of one Helm release are the
// endpoints of its headless Service. K8sDiscovery lists that Service's EndpointSlices,
// then watches them, and reports the whole peer set (node name -> gRPC address) each
// time it changes. It needs only get/list/watch on EndpointSlices in one namespace
// (the chart's Role). libcurl (loaded at run time: only agents that discover need it)
// carries the requests: TLS against the cluster's CA, the service-account token as
// bearer, and a watch that streams one JSON event a line.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace fuselink::services {

struct K8sDiscoveryOptions {
  // https://host:port; empty: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
  std::string api_server;
  // Read again on every request: kubelets rotate projected tokens.
  std::string token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token";
  std::string ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
  std::string namespace_name;  // the Service's namespace
  std::string service;         // the headless Service over the agents
  std::string port_name = "grpc";
  std::string self;                                 // this node: never a peer
  absl::Duration watch_timeout = absl::Minutes(5);  // then the watch is renewed
};

using PeerSet = std::map<std::string, std::string>;  // node name -> host:port

// One endpoint of an EndpointSlice, and the peers a set of slices gives. Pure
// functions, for tests. An endpoint without a node name, address or the named port
// gives no peer; `self` gives none.
absl::StatusOr<PeerSet> PeersOfSlice(absl::string_view slice_json,
                                     absl::string_view port_name, absl::string_view self);

class K8sDiscovery {
 public:
  // Lists the slices, hands the first peer set to `on_change` before returning, and
  // starts the watch thread, which calls `on_change` with every later set that
  // differs from the last. The first list must succeed (a wrong namespace or a
  // missing permission is a configuration error); later failures are retried with
  // backoff and the last peer set stays in force meanwhile.
  static absl::StatusOr<std::unique_ptr<K8sDiscovery>> Start(
      K8sDiscoveryOptions options, std::function<void(const PeerSet&)> on_change);
  ~K8sDiscovery();  // stops the thread; an open watch is aborted within about a second

  K8sDiscovery(const K8sDiscovery&) = delete;
  K8sDiscovery& operator=(const K8sDiscovery&) = delete;

 private:
  struct Slices;
  K8sDiscovery(K8sDiscoveryOptions options,
               std::function<void(const PeerSet&)> on_change);
  // Lists the slices; fills `slices_` and returns the list's resourceVersion.
  absl::StatusOr<std::string> List();
  // Watches from `version` until the server ends the watch or an error; applies events.
  absl::Status Watch(const std::string& version);
  void Run(std::string version);
  void Publish();

  const K8sDiscoveryOptions options_;
  const std::function<void(const PeerSet&)> on_change_;
  std::string api_version_;  // discovery.k8s.io/v1, or v1beta1 on servers before 1.21
  std::unique_ptr<Slices> slices_;  // touched by the watch thread only (after Start)
  PeerSet published_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace fuselink::services
