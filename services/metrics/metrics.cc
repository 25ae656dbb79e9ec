#include "services/metrics/metrics.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/check.h"
#include "agent/gpu/runtime.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace fuselink::services {

// Reads the node's live counters at scrape time. A scrape and Detach exclude each
// other, so the node can go while the HTTP server still serves.
class Metrics::NodeCollector final : public prometheus::Collectable {
 public:
  explicit NodeCollector(Node* node) : node_(node) {}

  void Detach() {
    absl::MutexLock lock(&mu_);
    node_ = nullptr;
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::ReaderMutexLock lock(&mu_);
    if (node_ == nullptr) return {};
    return CollectFrom(*node_);
  }

 private:
  static std::vector<prometheus::MetricFamily> CollectFrom(Node& node) {
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> out;
    const v1::Topology& topology = node.topology();
    // Own traffic: chunks of the NIC's owner GPU; borrowed: chunks other GPUs sent
    // (or received) through it.
    auto split = [&](const char* name, const char* help, auto own, auto borrowed) {
      prometheus::MetricFamily f{name, help, MetricType::Counter, {}};
      for (const v1::Nic& nic : topology.nics()) {
        for (bool is_own : {true, false}) {
          prometheus::ClientMetric m;
          m.label = {{"nic", nic.name()},
                     {"owner_gpu", absl::StrCat(nic.owner_gpu())},
                     {"traffic", is_own ? "own" : "borrowed"}};
          m.counter.value =
              static_cast<double>(is_own ? own(nic.index()) : borrowed(nic.index()));
          f.metric.push_back(std::move(m));
        }
      }
      out.push_back(std::move(f));
    };
    // One snapshot of each NIC's counters per scrape.
    std::vector<sched::NicStats> sent;
    std::vector<transfer::LandingNicStats> landed;
    for (int k = 0; k < topology.nics_size(); ++k) {
      sent.push_back(node.scheduler().Stats(k));
      landed.push_back(node.landing().Stats(k));
    }
    split(
        "fuselink_nic_transmitted_bytes_total",
        "Payload bytes sent through the NIC and acknowledged by the target.",
        [&](int k) { return sent[k].own_bytes; },
        [&](int k) { return sent[k].borrowed_bytes; });
    split(
        "fuselink_nic_received_bytes_total", "Payload bytes that landed through the NIC.",
        [&](int k) { return landed[k].own_bytes; },
        [&](int k) { return landed[k].borrowed_bytes; });
    auto per_nic_value = [&](const char* name, const char* help, MetricType type,
                             auto value) {
      prometheus::MetricFamily f{name, help, type, {}};
      for (const v1::Nic& nic : topology.nics()) {
        prometheus::ClientMetric m;
        m.label = {{"nic", nic.name()}, {"owner_gpu", absl::StrCat(nic.owner_gpu())}};
        const double v = static_cast<double>(value(nic.index()));
        (type == MetricType::Gauge ? m.gauge.value : m.counter.value) = v;
        f.metric.push_back(std::move(m));
      }
      out.push_back(std::move(f));
    };
    per_nic_value("fuselink_nic_owner_busy",
                  "1 while the NIC's owner GPU has traffic of its own on this node.",
                  MetricType::Gauge, [&](int k) { return sent[k].owner_busy; });
    per_nic_value("fuselink_nic_borrowed_chunks_in_flight",
                  "Chunks of other GPUs in flight on the NIC.", MetricType::Gauge,
                  [&](int k) { return sent[k].borrowed_in_flight; });
    per_nic_value("fuselink_nic_borrow_events_total",
                  "Times other GPUs began borrowing the idle NIC.", MetricType::Counter,
                  [&](int k) { return sent[k].borrow_events; });
    per_nic_value("fuselink_nic_give_back_events_total",
                  "Times the owner returned while its NIC was lent.", MetricType::Counter,
                  [&](int k) { return sent[k].give_back_events; });
    per_nic_value("fuselink_nic_idle_while_demand_seconds_total",
                  "Time the NIC had nothing in flight while a transfer of this node "
                  "waited to place a chunk (sampled every 5 ms).",
                  MetricType::Counter,
                  [&](int k) { return sent[k].idle_while_demand_ns / 1e9; });
    per_nic_value("fuselink_nic_failed_writes_total",
                  "Writes that failed on the NIC; their chunks went again on others.",
                  MetricType::Counter, [&](int k) { return sent[k].failed_chunks; });
    per_nic_value("fuselink_nic_receive_owner_busy",
                  "1 while an incoming transfer targets the NIC's owner GPU.",
                  MetricType::Gauge, [&](int k) { return landed[k].owner_busy; });
    per_nic_value("fuselink_fabric_malformed_frames_total",
                  "Frames from peers that were refused and closed their connection.",
                  MetricType::Counter,
                  [&](int k) { return node.fabric().counters(k).malformed_frames; });
    per_nic_value("fuselink_fabric_auth_failures_total",
                  "Connections accepted on the NIC that closed before they proved they "
                  "belong to an authenticated peer (the fabric handshake).",
                  MetricType::Counter,
                  [&](int k) { return node.fabric().counters(k).auth_failures; });
    per_nic_value("fuselink_fabric_refused_writes_total",
                  "Writes that arrived on the NIC and were refused before a byte "
                  "landed: no open window under their key, another peer's window, or "
                  "outside it.",
                  MetricType::Counter,
                  [&](int k) { return node.fabric().counters(k).refused_writes; });
    per_nic_value("fuselink_fabric_stalled_connections_total",
                  "Connections accepted on the NIC that closed because a frame, once "
                  "begun, sent no byte for --fabric_stall_timeout_ms (or an ACK found "
                  "no room as long).",
                  MetricType::Counter,
                  [&](int k) { return node.fabric().counters(k).stalled_connections; });
    per_nic_value("fuselink_fabric_ack_timeouts_total",
                  "Connections (TCP) or QPs (verbs) of this node on the NIC that closed "
                  "because their writes saw no acknowledgement for "
                  "--fabric_ack_timeout_ms; the writes went again.",
                  MetricType::Counter,
                  [&](int k) { return node.fabric().counters(k).ack_timeouts; });
    per_nic_value("fuselink_fabric_peer_connection_refusals_total",
                  "Connections accepted on the NIC and refused because their peer held "
                  "its share already (--fabric_connections_per_peer).",
                  MetricType::Counter, [&](int k) {
                    return node.fabric().counters(k).peer_connection_refusals;
                  });
    // Traffic that is not ours (agent/nicstat): per watched NIC and direction.
    // NICs not watched (loopback, a shared netdev, no counters) export no series
    // here: a zero would claim an idle link that nobody looked at.
    const nicstat::ForeignWatch& foreign = node.foreign();
    per_nic_value("fuselink_nic_foreign_watched",
                  "1 while the kernel's counters of the NIC are read for traffic that "
                  "is not fuselink's; 0 where they cannot be told apart (the agent logs "
                  "why at start-up).",
                  MetricType::Gauge, [&](int k) { return foreign.watched(k) ? 1 : 0; });
    if (foreign.any_watched()) {
      auto per_direction = [&](const char* name, const char* help, MetricType type,
                               auto value) {
        prometheus::MetricFamily f{name, help, type, {}};
        for (const v1::Nic& nic : topology.nics()) {
          const int k = static_cast<int>(nic.index());
          if (!foreign.watched(k)) continue;
          for (nicstat::Direction d : {nicstat::kTx, nicstat::kRx}) {
            prometheus::ClientMetric m;
            m.label = {{"nic", nic.name()},
                       {"owner_gpu", absl::StrCat(nic.owner_gpu())},
                       {"direction", d == nicstat::kTx ? "tx" : "rx"}};
            const double v = static_cast<double>(value(k, d));
            (type == MetricType::Gauge ? m.gauge.value : m.counter.value) = v;
            f.metric.push_back(std::move(m));
          }
        }
        out.push_back(std::move(f));
      };
      prometheus::MetricFamily errors{
          "fuselink_nic_foreign_read_errors_total",
          "Looks at the NIC whose kernel counters could not be read; after "
          "--foreign_hold_ms of them in a row the NIC is no longer foreign-busy.",
          MetricType::Counter,
          {}};
      for (const v1::Nic& nic : topology.nics()) {
        const int k = static_cast<int>(nic.index());
        if (!foreign.watched(k)) continue;
        prometheus::ClientMetric m;
        m.label = {{"nic", nic.name()}, {"owner_gpu", absl::StrCat(nic.owner_gpu())}};
        m.counter.value = static_cast<double>(foreign.read_errors(k));
        errors.metric.push_back(std::move(m));
      }
      out.push_back(std::move(errors));
      per_direction("fuselink_nic_foreign_bytes_total",
                    "Bytes the kernel counted on the NIC that fuselink did not move "
                    "(NCCL, storage, anyone's), its own frames' overhead allowed for.",
                    MetricType::Counter, [&](int k, nicstat::Direction d) {
                      return foreign.foreign_bytes(k, d);
                    });
      per_direction(
          "fuselink_nic_foreign_busy",
          "1 while foreign traffic on the NIC is above --foreign_busy_bytes_per_s "
          "that way. Under --policy=fuselink: tx, the NIC lends nothing to this "
          "node's GPUs; rx, sources are told it is not idle here. The static and "
          "stripe policies ignore it.",
          MetricType::Gauge,
          [&](int k, nicstat::Direction d) { return foreign.busy_mask(d) >> k & 1; });
    }
    // How each GPU's memory crosses each NIC (agent/fabric/verbs/staging.h): one
    // series per pair, 1, with the path as a label.
    if (const gpu::Runtime* gpus = node.gpu(); gpus != nullptr) {
      prometheus::MetricFamily paths{
          "fuselink_gpu_nic_path",
          "1 for each GPU and NIC: how the transport moves that GPU's memory over "
          "the NIC (dma-buf, peer-memory: the NIC reaches it; staged: through "
          "pinned host memory; none).",
          MetricType::Gauge,
          {}};
      for (int g = 0; g < gpus->count(); ++g) {
        for (const v1::Nic& nic : topology.nics()) {
          prometheus::ClientMetric m;
          m.label = {{"gpu", absl::StrCat(g)},
                     {"nic", nic.name()},
                     {"path", node.fabric().GpuPath(g, static_cast<int>(nic.index()))}};
          m.gauge.value = 1;
          paths.metric.push_back(std::move(m));
        }
      }
      out.push_back(std::move(paths));
    }
    auto gauge = [&](const char* name, const char* help, double value) {
      prometheus::MetricFamily f{name, help, MetricType::Gauge, {}};
      prometheus::ClientMetric m;
      m.gauge.value = value;
      f.metric.push_back(std::move(m));
      out.push_back(std::move(f));
    };
    gauge("fuselink_transfers_active", "Outgoing transfers preparing or running.",
          static_cast<double>(node.engine().active()));
    gauge("fuselink_incoming_transfers_active",
          "Incoming transfers with a slot reserved on this node.",
          static_cast<double>(node.landing().active()));
    gauge("fuselink_tensors_registered", "Tensors registered on this node.",
          static_cast<double>(node.registry().size()));
    if (const relay::GpuRelayPool* pool = node.gpu_relay(); pool != nullptr) {
      const int gpus = node.gpu()->count();
      auto per_gpu = [&](const char* name, const char* help, auto value) {
        prometheus::MetricFamily f{name, help, MetricType::Gauge, {}};
        for (int g = 0; g < gpus; ++g) {
          prometheus::ClientMetric m;
          m.label = {{"gpu", absl::StrCat(g)}};
          m.gauge.value = static_cast<double>(value(pool->stats(g)));
          f.metric.push_back(std::move(m));
        }
        out.push_back(std::move(f));
      };
      per_gpu("fuselink_relay_device_bytes",
              "Device memory held for relay slots on the GPU (at most the relay cap).",
              [](const relay::GpuRelayStats& s) { return s.held_bytes; });
      per_gpu("fuselink_relay_slots_in_use", "Relay slots on the GPU holding a chunk.",
              [](const relay::GpuRelayStats& s) { return s.slots_in_use; });
      per_gpu("fuselink_relay_paused",
              "1 while the GPU is short of free memory: its relay slots are given back "
              "and its NICs lend nothing.",
              [](const relay::GpuRelayStats& s) { return s.paused ? 1 : 0; });
      gauge("fuselink_relay_device_cap_bytes", "The relay cap per GPU.",
            static_cast<double>(pool->options().cap_bytes_per_gpu));
      gauge("fuselink_stage_device_bytes",
            "Device memory of the fabric's GPU staging: landing buffers for bytes that "
            "arrive on one GPU's NIC for another GPU.",
            static_cast<double>(node.stager()->device_bytes()));
      gauge("fuselink_stage_pinned_host_bytes",
            "Pinned host buffers the fabric moves GPU bytes through.",
            static_cast<double>(node.stager()->pinned_host_bytes()));
      prometheus::MetricFamily remaps{
          "fuselink_relay_remaps_total",
          "Relay slot mappings made and unmapped (the pool growing and shrinking).",
          MetricType::Counter,
          {}};
      prometheus::ClientMetric r;
      r.counter.value = static_cast<double>(pool->remaps());
      remaps.metric.push_back(std::move(r));
      out.push_back(std::move(remaps));
      prometheus::MetricFamily staged{"fuselink_relay_staged_bytes_total",
                                      "Bytes staged into GPU relay slots, by way in.",
                                      MetricType::Counter,
                                      {}};
      for (auto [way, bytes] : {std::pair{"d1", pool->kernel_bytes()},
                                std::pair{"d2", pool->copy_engine_bytes()}}) {
        prometheus::ClientMetric m;
        m.label = {{"stage", way}};
        m.counter.value = static_cast<double>(bytes);
        staged.metric.push_back(std::move(m));
      }
      out.push_back(std::move(staged));
    }
    auto counter = [&](const char* name, const char* help, double value) {
      prometheus::MetricFamily f{name, help, MetricType::Counter, {}};
      prometheus::ClientMetric m;
      m.counter.value = value;
      f.metric.push_back(std::move(m));
      out.push_back(std::move(f));
    };
    counter("fuselink_stray_writes_total",
            "Writes and notices that named no open incoming transfer of their source "
            "(late, stale or misdirected); none of their bytes counted.",
            static_cast<double>(node.landing().stray_writes()));
    counter("fuselink_stray_completions_total",
            "Write completions that named no write in flight (repeated or forged by a "
            "transport); they changed nothing.",
            static_cast<double>(node.engine().stray_completions()));
    counter("fuselink_stray_verdicts_total",
            "Verdict notices that named no live outgoing transfer (repeated, late or "
            "forged); they changed nothing.",
            static_cast<double>(node.engine().stray_verdicts()));
    counter("fuselink_relay_fence_errors_total",
            "GPU relay copies whose fence failed while their slot waited to be "
            "released; the slot was released all the same.",
            static_cast<double>(node.engine().fence_errors()));
    counter("fuselink_invariant_failures_total",
            "Invariants of the agent's own code (FL_EXPECT, agent/common/check.h) found "
            "broken and gone on from; any is a bug to report.",
            static_cast<double>(InvariantFailures()));
    counter("fuselink_transfer_forced_drains_total",
            "Ended transfers whose writes were still in flight after "
            "--transfer_drain_timeout_ms, so that the connections to their target "
            "were closed to fail them.",
            static_cast<double>(node.engine().forced_drains()));
    counter("fuselink_notices_dropped_total",
            "Verdict and idle-NIC notices to other agents that were dropped (queue "
            "full, or the node unreachable); a source then asks for its verdict over "
            "gRPC.",
            static_cast<double>(node.notices_dropped()));
    // Access control (agent/security, docs/security.md).
    gauge("fuselink_plaintext",
          "1 when the agent runs with --plaintext: no TLS and no authentication; anyone "
          "may do anything.",
          node.guard().open() ? 1 : 0);
    {
      prometheus::MetricFamily refusals{
          "fuselink_access_refusals_total",
          "gRPC calls refused by access control, by reason (UNAUTHENTICATED: "
          "NO_CLIENT_CERTIFICATE, NO_IDENTITY; PERMISSION_DENIED: the others).",
          MetricType::Counter,
          {}};
      for (const auto& [reason, n] : node.guard().refusals()) {
        prometheus::ClientMetric r;
        r.label = {{"reason", std::string(reason)}};
        r.counter.value = static_cast<double>(n);
        refusals.metric.push_back(std::move(r));
      }
      out.push_back(std::move(refusals));
    }
    // In-node moves (fabric/in_node_fabric.h): copies by this node's own engines,
    // which no NIC carries, so they are in none of the per-NIC series above.
    {
      const fabric::InNodeCounters c = node.in_node_counters();
      prometheus::MetricFamily f{
          "fuselink_in_node_bytes_total",
          "Payload bytes of in-node moves (source and target on this agent), by what "
          "copied them: memcpy between host memory, or a GPU's copy engine (GPU to "
          "GPU over NVLink, host to GPU and back over PCIe). No NIC carries them.",
          MetricType::Counter,
          {}};
      for (const auto& [memory, bytes] :
           {std::pair{"host", c.host_bytes}, std::pair{"gpu", c.device_bytes}}) {
        prometheus::ClientMetric m;
        m.label = {{"copy", memory}};
        m.counter.value = static_cast<double>(bytes);
        f.metric.push_back(std::move(m));
      }
      out.push_back(std::move(f));
    }
    counter("fuselink_in_node_failed_copies_total",
            "In-node writes whose copy (or the device work it waited for) failed; "
            "their transfers failed.",
            static_cast<double>(node.in_node_counters().failed_copies));
    counter("fuselink_in_node_refused_writes_total",
            "In-node writes refused before a byte landed: no open window of this "
            "node's own under their key (late, or closed), or outside it.",
            static_cast<double>(node.in_node_counters().refused_writes));
    {
      // Shares per identity (docs/security.md): every reason, also at 0.
      const memory::ShareRefusals registry = node.registry().share_refusals();
      prometheus::MetricFamily f{
          "fuselink_share_refusals_total",
          "Calls refused RESOURCE_EXHAUSTED because their caller held its share, by "
          "reason: TENSOR_SHARE, LAYOUT_PART_SHARE (RegisterTensor, per engine), "
          "WATCH_SHARE (WatchTransfers, per identity), TRANSFER_SHARE "
          "(TransferKVCache, per router).",
          MetricType::Counter,
          {}};
      for (const auto& [reason, n] :
           {std::pair{"TENSOR_SHARE", registry.tensors},
            std::pair{"LAYOUT_PART_SHARE", registry.layout_parts},
            std::pair{"WATCH_SHARE", node.watch_hub().share_refusals()},
            std::pair{"TRANSFER_SHARE", node.engine().share_refusals()}}) {
        prometheus::ClientMetric m;
        m.label = {{"reason", reason}};
        m.counter.value = static_cast<double>(n);
        f.metric.push_back(std::move(m));
      }
      out.push_back(std::move(f));
    }
    counter("fuselink_incoming_share_refusals_total",
            "PrepareIncoming calls refused because their source held its share of the "
            "incoming slots (RESOURCE_EXHAUSTED, SOURCE_SHARE).",
            static_cast<double>(node.landing().share_refusals()));
    counter("fuselink_incoming_scattered_writes_total",
            "Incoming transfers ended PROTOCOL because their source's writes left more "
            "disjoint landed ranges than a transfer of their blocks can.",
            static_cast<double>(node.landing().scattered_writes()));
    counter("fuselink_prepare_queue_full_total",
            "Calls to a target refused because its lane was full "
            "(--prepare_queue_per_target): the transfer failed RESOURCE_EXHAUSTED "
            "(PREPARE_QUEUE_FULL), or a question about its verdict went unasked.",
            static_cast<double>(node.engine().prepares_refused()));
    counter("fuselink_incoming_prepares_busy_total",
            "Peers' PrepareIncoming calls refused past --incoming_prepares_per_source "
            "or --incoming_prepares_pending (RESOURCE_EXHAUSTED, "
            "INCOMING_PREPARES_BUSY).",
            static_cast<double>(node.incoming_prepares().refused()));
    counter("fuselink_registrations_busy_total",
            "RegisterTensor and UnregisterTensor calls refused past "
            "--registrations_per_caller or "
            "--registrations_pending (RESOURCE_EXHAUSTED, REGISTRATIONS_BUSY).",
            static_cast<double>(node.registrations().refused()));
    counter("fuselink_incoming_unstarted_expired_total",
            "Incoming transfers ended because their source sent nothing after it "
            "prepared them (the tensor's pin let go).",
            static_cast<double>(node.landing().unstarted_expired()));
    // --- The handle socket (services/handle_socket/socket.h): what it refused. ---
    {
      const HandleSocketStats h = node.handle_socket_counters().Read();
      counter("fuselink_handle_socket_timeouts_total",
              "Handle socket connections closed for silence or an untaken reply.",
              static_cast<double>(h.timed_out));
      counter("fuselink_handle_socket_refused_clients_total",
              "Handle socket connections refused: too many served at once.",
              static_cast<double>(h.refused_too_many_clients));
      counter("fuselink_handle_socket_bad_messages_total",
              "Handle socket messages refused: not one 'F' with one descriptor.",
              static_cast<double>(h.bad_messages));
    }
    // --- end of the handle socket's block ---
    {  // CUDA IPC handles refused (agent/node/ipc_imports.h).
      const ImportRefusals r = node.ipc_imports().refusals();
      prometheus::MetricFamily f{
          "fuselink_gpu_handle_refusals_total",
          "CUDA IPC handles refused, by reason: OWNER_TOKEN_REQUIRED (no token from "
          "the handle socket), GPU_HANDLE_OWNED (another owner lent it), "
          "GPU_HANDLE_CLOSING (its import still closing past the bound).",
          MetricType::Counter,
          {}};
      for (const auto& [reason, n] : {std::pair{"OWNER_TOKEN_REQUIRED", r.no_owner_token},
                                      std::pair{"GPU_HANDLE_OWNED", r.owned},
                                      std::pair{"GPU_HANDLE_CLOSING", r.closing}}) {
        prometheus::ClientMetric m;
        m.label = {{"reason", reason}};
        m.counter.value = static_cast<double>(n);
        f.metric.push_back(std::move(m));
      }
      out.push_back(std::move(f));
    }
    return out;
  }

  mutable absl::Mutex mu_;
  Node* node_ ABSL_GUARDED_BY(mu_);
};

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
  auto counter = [&](const char* name, const char* help, uint64_t value) {
    prometheus::MetricFamily f{name, help, prometheus::MetricType::Counter, {}};
    prometheus::ClientMetric m;
    m.counter.value = static_cast<double>(value);
    f.metric.push_back(std::move(m));
    families.push_back(std::move(f));
  };
  std::shared_ptr<NodeCollector> collector;
  {
    // Held while tls_ and discovery_ are read: AttachDiscovery(nullptr) then waits.
    absl::MutexLock lock(&collector_mu_);
    collector = collector_;
    if (tls_ != nullptr) {
      const security::TlsStage::Counts counts = tls_->reload_counts();
      counter("fuselink_tls_reloads_total",
              "Rotations of the gRPC TLS files (--tls_cert, --tls_key, --tls_ca) that "
              "checked out and serve new connections.",
              counts.reloads);
      counter("fuselink_tls_reload_failures_total",
              "Rotations of the gRPC TLS files refused: a file that does not parse, or "
              "a key that is not the certificate's. The last good set keeps serving; "
              "the agent's log says why.",
              counts.failed_reloads);
    }
    if (discovery_ != nullptr) {
      prometheus::MetricFamily ends{
          "fuselink_k8s_watch_ends_total",
          "Watches of the agents' EndpointSlices that ended, by reason: renewed (the "
          "server's timeout; watched again), gone (410 or an ERROR event; listed "
          "again), error (transport or HTTP; listed again). Each is followed by a "
          "backoff.",
          prometheus::MetricType::Counter,
          {}};
      for (int k = 0; k < kWatchEndKinds; ++k) {
        const auto end = static_cast<WatchEnd>(k);
        prometheus::ClientMetric m;
        m.label = {{"reason", std::string(WatchEndName(end))}};
        m.counter.value = static_cast<double>(discovery_->watch_ends(end));
        ends.metric.push_back(std::move(m));
      }
      families.push_back(std::move(ends));
      counter("fuselink_k8s_list_failures_total",
              "Lists of the agents' EndpointSlices after the first that failed; each is "
              "retried after a backoff, the last peer set in force meanwhile.",
              discovery_->failed_lists());
    }
  }
  if (collector) {
    std::vector<prometheus::MetricFamily> node = collector->Collect();
    families.insert(families.end(), std::make_move_iterator(node.begin()),
                    std::make_move_iterator(node.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

void Metrics::Detach() {
  absl::MutexLock lock(&collector_mu_);
  if (collector_) collector_->Detach();
}

Metrics::~Metrics() { server_.reset(); }

void Metrics::Attach(Node* node) {
  for (const v1::Nic& nic : node->topology().nics()) {
    give_back_.push_back(&give_back_family_->Add(
        {{"nic", nic.name()}}, prometheus::Histogram::BucketBoundaries{
                                   0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                   0.025, 0.05, 0.1, 0.25, 0.5, 1}));
  }
  absl::MutexLock lock(&collector_mu_);
  collector_ = std::make_shared<NodeCollector>(node);
}

void Metrics::AttachTls(const security::TlsCredentials* tls) {
  absl::MutexLock lock(&collector_mu_);
  tls_ = tls;
}

void Metrics::AttachDiscovery(const K8sDiscovery* discovery) {
  absl::MutexLock lock(&collector_mu_);
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
