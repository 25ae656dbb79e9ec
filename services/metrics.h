// Prometheus metrics of one agent, served at http://<listen>/metrics. Counters the
// data plane keeps (per-NIC bytes, malformed frames) are read at scrape time;
// transfer outcomes and durations are recorded as transfers finish.
#pragma once

#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/node.h"

namespace fuselink::services {

class Metrics final : public transfer::EngineObserver {
 public:
  // Starts the HTTP exposer on `listen` ("host:port"; port 0 lets the kernel pick).
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& listen);
  ~Metrics() override;

  // Exposes the node's own counters. Call once, before scrapes matter.
  void Attach(Node* node);
  // Stops reading the node: a scrape in progress finishes first, later scrapes see
  // only the transfer outcomes. Call before the node goes.
  void Detach();
  int port() const;

  void OnTransferFinished(transfer::State state, absl::Duration elapsed,
                          uint64_t bytes) override;
  void OnGiveBack(int nic, absl::Duration waited) override;

 private:
  class NodeCollector;
  explicit Metrics(std::unique_ptr<prometheus::Exposer> exposer);

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<NodeCollector> collector_;
  prometheus::Counter* completed_;
  prometheus::Counter* failed_;
  prometheus::Counter* cancelled_;
  prometheus::Histogram* duration_;
  prometheus::Family<prometheus::Histogram>* give_back_family_;
  std::vector<prometheus::Histogram*> give_back_;  // per NIC, filled by Attach
};

}  // namespace fuselink::services
