// Prometheus metrics of one agent, served at http(s)://<listen>/metrics by the
// project's own HTTP server (services/metrics/http/metrics_server.h). What the parts
// count is read at scrape time from the stats sources attached (agent/common/stats.h:
// the node, the TLS files, Kubernetes discovery), each of which names and describes
// its own series; transfer outcomes and durations are recorded here as transfers
// finish.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "agent/common/stats.h"
#include "agent/security/credentials.h"
#include "agent/transfer/engine.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/discovery/k8s_discovery.h"
#include "services/metrics/http/metrics_server.h"
#include "services/metrics/http/web_config.h"

namespace fuselink::services {

// How /metrics is served besides its address.
struct MetricsEndpoint {
  http::WebConfig web_config;  // TLS and basic auth; default plain HTTP, no auth
  int max_connections = http::kDefaultMaxConnections;
  // Basic-auth checks (bcrypt) waiting for the one worker; a request past it is
  // answered 503 at once (http/basic_auth.h). 1 to http::kMaxAuthQueueDepth.
  int auth_queue_depth = http::kDefaultAuthQueueDepth;

  // INVALID_ARGUMENT naming a field out of its range (agent/common/options.h).
  absl::Status Validate() const;
};

class Metrics final : public transfer::EngineObserver {
 public:
  // Starts serving on `listen` ("host:port", bound to that address only; port 0
  // lets the kernel pick).
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(
      const std::string& listen, const MetricsEndpoint& endpoint = {});
  ~Metrics() override;

  // Exposes what the node's parts count (`node` outlives the attachment: Detach),
  // per-NIC series labelled from `nics`. Call once, before scrapes matter.
  void Attach(const stats::Source* node, std::vector<stats::NicLabel> nics);
  // Exposes the gRPC TLS files' reloads (security/tls_stage.h), read at scrape time
  // from `tls`, which must outlive this. Call once, or never (plaintext).
  void AttachTls(const security::TlsCredentials* tls);
  // Exposes Kubernetes discovery's watch ends and failed lists, read at scrape time
  // from `discovery`; null stops. Call with null before `discovery` goes; never
  // called (static peers): no such series.
  void AttachDiscovery(const K8sDiscovery* discovery);
  // Stops reading the node: a scrape in progress finishes first, later scrapes see
  // only the transfer outcomes. Call before the node goes.
  void Detach();
  int port() const;

  void OnTransferFinished(transfer::State state, absl::Duration elapsed,
                          uint64_t bytes) override;
  void OnGiveBack(int nic, absl::Duration waited) override;

 private:
  Metrics();
  // The text exposition of every family: the registry's, then the sources'. Called
  // on the server's thread.
  std::string Render() const;

  std::shared_ptr<prometheus::Registry> registry_;
  mutable absl::Mutex sources_mu_;
  const stats::Source* node_ ABSL_GUARDED_BY(sources_mu_) = nullptr;
  std::vector<stats::NicLabel> nics_ ABSL_GUARDED_BY(sources_mu_);
  const security::TlsCredentials* tls_ ABSL_GUARDED_BY(sources_mu_) = nullptr;
  const K8sDiscovery* discovery_ ABSL_GUARDED_BY(sources_mu_) = nullptr;
  prometheus::Counter* completed_;
  prometheus::Counter* failed_;
  prometheus::Counter* cancelled_;
  prometheus::Histogram* duration_;
  prometheus::Family<prometheus::Histogram>* give_back_family_;
  std::vector<prometheus::Histogram*> give_back_;  // per NIC, filled by Attach
  // fuselink_metrics_http_refusals_total, by http::Refusal.
  std::array<prometheus::Counter*, http::kRefusalKinds> refusals_{};
  // Last: it goes first, so that no scrape runs while the rest goes.
  std::unique_ptr<http::MetricsServer> server_;
};

}  // namespace fuselink::services
