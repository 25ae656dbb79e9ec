// Peers from the Kubernetes API server: the agents of one Helm release are the
// endpoints of its headless Service. K8sDiscovery lists that Service's EndpointSlices,
// then watches them, and reports the whole peer set (node name -> gRPC address) each
// time it changes. It needs only get/list/watch on EndpointSlices in one namespace
// (the chart's Role). libcurl (linked; the image ships libcurl4) carries the
// requests: TLS against the cluster's CA, the service-account token as bearer, and a
// watch that streams one JSON event a line.
//
// Addresses follow each slice's addressType: an IPv4 slice gives "a.b.c.d:port", an
// IPv6 slice "[v6]:port" (what gRPC dials); an address that is not of its slice's
// family is skipped, and FQDN slices (which the endpoint controller never writes for
// a selector Service) give no peers. A dual-stack Service has a slice of each family
// naming the same nodes: each node gets the address of the preferred family
// (K8sDiscoveryOptions::prefer, --k8s_address_family), the other family's only where
// the node has no address of the preferred one.
//
// Every end of a watch (the server's renewal, an error, 410 Gone) is counted and is
// followed by a pause of a jittered, doubling backoff (backoff_min to backoff_max)
// before the next watch or list, so that a server that ends watches at once cannot
// make the agent spin; a watch that lived backoff_max or longer was healthy, and
// starts the backoff afresh.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/common/stats.h"

namespace fuselink::services {

enum class AddressFamily { kIPv4, kIPv6 };

// The family an agent that listens on `listen` ("host:port", "[v6]:port") is reached
// by: IPv6 when the host is an IPv6 literal, else IPv4. Peers of one release listen
// alike, so this is the family to dial them in.
AddressFamily FamilyOfListen(absl::string_view listen);

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
  // Dual stack: whose addresses peers get (see above).
  AddressFamily prefer = AddressFamily::kIPv4;
  // The pause after a watch ends, before the next watch (or list): drawn from
  // [b/2, b] for a backoff b that starts at backoff_min and doubles up to
  // backoff_max. Both positive, min <= max.
  absl::Duration backoff_min = absl::Seconds(1);
  absl::Duration backoff_max = absl::Seconds(30);
};

using PeerSet = std::map<std::string, std::string>;  // node name -> host:port

// The peers one EndpointSlice gives, by the family of their address.
struct SlicePeers {
  PeerSet ipv4;
  PeerSet ipv6;
  bool operator==(const SlicePeers&) const = default;
};

// One EndpointSlice's peers. Pure, for tests. An endpoint without a node name, an
// address of the slice's addressType or the named port gives no peer; `self` gives
// none; an FQDN or unknown addressType gives none. A slice without addressType (not
// written by any API server, but cheap to read) takes each address's own family.
// INVALID_ARGUMENT when `slice_json` is not JSON.
absl::StatusOr<SlicePeers> PeersOfSlice(absl::string_view slice_json,
                                        absl::string_view port_name,
                                        absl::string_view self);

// The peer set of several slices (by slice name): each node's address from the
// `prefer` family, else from the other; within a family, from the slice whose name
// sorts first. Pure.
PeerSet MergePeers(const std::map<std::string, SlicePeers>& by_slice,
                   AddressFamily prefer);

// The backoff before the next watch: `backoff` jittered into [backoff/2, backoff] by
// `unit`, a draw from [0, 1]. Pure.
absl::Duration Jittered(absl::Duration backoff, double unit);

// Why a watch ended; each end is counted by its reason.
enum class WatchEnd {
  kRenewed,  // the server ended it (its timeout): watched again from the last version
  kGone,     // 410 Gone or an ERROR event: listed again
  kError,    // a transport or HTTP error: listed again
};
inline constexpr int kWatchEndKinds = 3;
absl::string_view WatchEndName(WatchEnd end);  // "renewed", "gone", "error"

class K8sDiscovery {
 public:
  // Lists the slices, hands the first peer set to `on_change` before returning, and
  // starts the watch thread, which calls `on_change` with every later set that
  // differs from the last. The first list must succeed (a wrong namespace or a
  // missing permission is a configuration error); later failures are retried with
  // backoff and the last peer set stays in force meanwhile.
  static absl::StatusOr<std::unique_ptr<K8sDiscovery>> Start(
      K8sDiscoveryOptions options, std::function<void(const PeerSet&)> on_change);
  // Stops the thread: a backoff pause ends at once, an open watch or list is aborted
  // within about a second (libcurl's progress callback).
  ~K8sDiscovery();

  // Watches that ended, by reason; any thread.
  uint64_t watch_ends(WatchEnd end) const {
    return watch_ends_[static_cast<int>(end)].load(std::memory_order_relaxed);
  }
  // Lists after the first that failed (each is followed by a backoff); any thread.
  uint64_t failed_lists() const { return failed_lists_.load(std::memory_order_relaxed); }

  K8sDiscovery(const K8sDiscovery&) = delete;
  K8sDiscovery& operator=(const K8sDiscovery&) = delete;

  // Watches ended, by reason, and lists failed.
  void ReportStats(stats::Sink& sink) const;

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
  // Waits `pause` or until stopped; false when stopped.
  bool Pause(absl::Duration pause);

  const K8sDiscoveryOptions options_;
  const std::function<void(const PeerSet&)> on_change_;
  std::string api_version_;  // discovery.k8s.io/v1, or v1beta1 on servers before 1.21
  std::unique_ptr<Slices> slices_;  // touched by the watch thread only (after Start)
  PeerSet published_;
  std::atomic<bool> stopping_{false};  // read by libcurl's progress callback
  absl::Notification stop_;            // ends a backoff pause
  std::array<std::atomic<uint64_t>, kWatchEndKinds> watch_ends_{};
  std::atomic<uint64_t> failed_lists_{0};
  std::thread thread_;
};

}  // namespace fuselink::services
