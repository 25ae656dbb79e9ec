#include "services/metrics.h"

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace fuselink::services {

// Reads the node's live counters at scrape time.
class Metrics::NodeCollector final : public prometheus::Collectable {
 public:
  explicit NodeCollector(Node* node) : node_(node) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> out;
    const v1::Topology& topology = node_->topology();
    auto per_nic = [&](const char* name, const char* help, auto field) {
      prometheus::MetricFamily f{name, help, MetricType::Counter, {}};
      for (const v1::Nic& nic : topology.nics()) {
        prometheus::ClientMetric m;
        m.label = {{"nic", nic.name()}, {"owner_gpu", absl::StrCat(nic.owner_gpu())}};
        m.counter.value =
            static_cast<double>(field(node_->fabric().counters(nic.index())));
        f.metric.push_back(std::move(m));
      }
      out.push_back(std::move(f));
    };
    per_nic("fuselink_nic_transmitted_bytes_total",
            "Payload bytes this node's NIC sent and the target acknowledged.",
            [](const fabric::NicCounters& c) { return c.transmitted_bytes; });
    per_nic("fuselink_nic_received_bytes_total",
            "Payload bytes that landed through this NIC.",
            [](const fabric::NicCounters& c) { return c.received_bytes; });
    per_nic("fuselink_fabric_malformed_frames_total",
            "Frames from peers that were refused and closed their connection.",
            [](const fabric::NicCounters& c) { return c.malformed_frames; });
    auto gauge = [&](const char* name, const char* help, double value) {
      prometheus::MetricFamily f{name, help, MetricType::Gauge, {}};
      prometheus::ClientMetric m;
      m.gauge.value = value;
      f.metric.push_back(std::move(m));
      out.push_back(std::move(f));
    };
    gauge("fuselink_transfers_active", "Outgoing transfers preparing or running.",
          static_cast<double>(node_->engine().active()));
    gauge("fuselink_incoming_transfers_active",
          "Incoming transfers with a slot reserved on this node.",
          static_cast<double>(node_->landing().active()));
    gauge("fuselink_tensors_registered", "Tensors registered on this node.",
          static_cast<double>(node_->registry().size()));
    prometheus::MetricFamily stray{"fuselink_stray_writes_total",
                                   "Writes that named no live incoming transfer.",
                                   MetricType::Counter,
                                   {}};
    prometheus::ClientMetric m;
    m.counter.value = static_cast<double>(node_->landing().stray_writes());
    stray.metric.push_back(std::move(m));
    out.push_back(std::move(stray));
    return out;
  }

 private:
  Node* const node_;
};

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen) {
  try {
    return std::unique_ptr<Metrics>(
        new Metrics(std::make_unique<prometheus::Exposer>(listen)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics on ", listen, ": ", e.what()));
  }
}

Metrics::Metrics(std::unique_ptr<prometheus::Exposer> exposer)
    : exposer_(std::move(exposer)), registry_(std::make_shared<prometheus::Registry>()) {
  auto& outcomes = prometheus::BuildCounter()
                       .Name("fuselink_transfers_total")
                       .Help("Outgoing transfers that ended, by outcome.")
                       .Register(*registry_);
  completed_ = &outcomes.Add({{"outcome", "completed"}});
  failed_ = &outcomes.Add({{"outcome", "failed"}});
  cancelled_ = &outcomes.Add({{"outcome", "cancelled"}});
  duration_ = &prometheus::BuildHistogram()
                   .Name("fuselink_transfer_duration_seconds")
                   .Help("Time from acceptance to the last acknowledged byte.")
                   .Register(*registry_)
                   .Add({}, prometheus::Histogram::BucketBoundaries{
                                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                1, 2.5, 5, 10, 30, 60});
  exposer_->RegisterCollectable(registry_);
}

Metrics::~Metrics() {
  exposer_->RemoveCollectable(registry_);
  if (collector_) exposer_->RemoveCollectable(collector_);
}

void Metrics::Attach(Node* node) {
  collector_ = std::make_shared<NodeCollector>(node);
  exposer_->RegisterCollectable(collector_);
}

int Metrics::port() const { return exposer_->GetListeningPorts().front(); }

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
