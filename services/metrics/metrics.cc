#include "services/metrics/metrics.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/options.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace fuselink::services {

absl::Status MetricsEndpoint::Validate() const {
  return InRange("auth_queue_depth", auth_queue_depth, 1, http::kMaxAuthQueueDepth);
}

namespace {

prometheus::MetricFamily ToFamily(const stats::Series& series) {
  const bool gauge = series.family.kind == stats::Kind::kGauge;
  prometheus::MetricFamily f{
      series.family.name,
      series.family.help,
      gauge ? prometheus::MetricType::Gauge : prometheus::MetricType::Counter,
      {}};
  for (const stats::Sample& sample : series.samples) {
    prometheus::ClientMetric m;
    for (const auto& [name, value] : sample.labels) m.label.push_back({name, value});
    (gauge ? m.gauge.value : m.counter.value) = sample.value;
    f.metric.push_back(std::move(m));
  }
  return f;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen,
                                                        const MetricsEndpoint& endpoint) {
  std::unique_ptr<Metrics> metrics(new Metrics());
  http::MetricsServerOptions options;
  options.listen = listen;
  options.web_config = endpoint.web_config;
  options.max_connections = endpoint.max_connections;
  options.auth_queue_depth = endpoint.auth_queue_depth;
  Metrics* self = metrics.get();
  options.render = [self] { return self->Render(); };
  options.on_refusal = [self](http::Refusal refusal) {
    self->refusals_[static_cast<int>(refusal)]->Increment();
  };
  absl::StatusOr<std::unique_ptr<http::MetricsServer>> server =
      http::MetricsServer::Start(std::move(options));
  if (!server.ok()) {
    return absl::Status(server.status().code(), absl::StrCat("metrics on ", listen, ": ",
                                                             server.status().message()));
  }
  metrics->server_ = *std::move(server);
  return metrics;
}

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& outcomes = prometheus::BuildCounter()
                       .Name("fuselink_transfers_total")
                       .Help("Outgoing transfers that ended, by outcome.")
                       .Register(*registry_);
  completed_ = &outcomes.Add({{"outcome", "completed"}});
  failed_ = &outcomes.Add({{"outcome", "failed"}});
  cancelled_ = &outcomes.Add({{"outcome", "cancelled"}});
  duration_ = &prometheus::BuildHistogram()
                   .Name("fuselink_transfer_duration_seconds")
                   .Help("Completed transfers, from acceptance to the target's verdict.")
                   .Register(*registry_)
                   .Add({}, prometheus::Histogram::BucketBoundaries{
                                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                1, 2.5, 5, 10, 30, 60});
  give_back_family_ = &prometheus::BuildHistogram()
                           .Name("fuselink_nic_give_back_seconds")
                           .Help(
                               "From the owner's return to the last borrowed chunk "
                               "leaving its NIC.")
                           .Register(*registry_);
  auto& refusals = prometheus::BuildCounter()
                       .Name("fuselink_metrics_http_refusals_total")
                       .Help(
                           "Connections and requests the /metrics server refused, by "
                           "reason.")
                       .Register(*registry_);
  for (int r = 0; r < http::kRefusalKinds; ++r) {
    refusals_[r] = &refusals.Add(
        {{"reason", std::string(http::RefusalName(static_cast<http::Refusal>(r)))}});
  }
}

std::string Metrics::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::vector<stats::Series> series;
  {
    // Held while the sources report: Detach and AttachDiscovery(nullptr) wait for a
    // scrape under way, so a source can go once they return.
    absl::MutexLock lock(&sources_mu_);
    stats::Sink sink(nics_);
    if (tls_ != nullptr) tls_->ReportStats(sink);
    if (discovery_ != nullptr) discovery_->ReportStats(sink);
    if (node_ != nullptr) node_->ReportStats(sink);
    series = sink.series();
  }
  for (const stats::Series& s : series) families.push_back(ToFamily(s));
  return prometheus::TextSerializer().Serialize(families);
}

void Metrics::Detach() {
  absl::MutexLock lock(&sources_mu_);
  node_ = nullptr;
}

Metrics::~Metrics() { server_.reset(); }

void Metrics::Attach(const stats::Source* node, std::vector<stats::NicLabel> nics) {
  for (const stats::NicLabel& nic : nics) {
    give_back_.push_back(&give_back_family_->Add(
        {{"nic", nic.name}}, prometheus::Histogram::BucketBoundaries{
                                 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                 0.025, 0.05, 0.1, 0.25, 0.5, 1}));
  }
  absl::MutexLock lock(&sources_mu_);
  nics_ = std::move(nics);
  node_ = node;
}

void Metrics::AttachTls(const security::TlsCredentials* tls) {
  absl::MutexLock lock(&sources_mu_);
  tls_ = tls;
}

void Metrics::AttachDiscovery(const K8sDiscovery* discovery) {
  absl::MutexLock lock(&sources_mu_);
  discovery_ = discovery;
}

int Metrics::port() const { return server_->port(); }

void Metrics::OnGiveBack(int nic, absl::Duration waited) {
  if (nic >= 0 && nic < static_cast<int>(give_back_.size())) {
    give_back_[nic]->Observe(absl::ToDoubleSeconds(waited));
  }
}

void Metrics::OnTransferFinished(transfer::State state, absl::Duration elapsed,
                                 uint64_t bytes) {
  switch (state) {
    case transfer::State::kCompleted:
      completed_->Increment();
      duration_->Observe(absl::ToDoubleSeconds(elapsed));
      break;
    case transfer::State::kCancelled:
      cancelled_->Increment();
      break;
    default:
      failed_->Increment();
  }
}

}  // namespace fuselink::services
