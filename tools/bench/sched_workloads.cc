// The driver, and the two workloads about one NIC: hot (a GPU borrows idle NICs)
// and owner (the owner of a lent NIC returns).
#include "tools/bench/sched_workloads.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "clients/cpp/scrape.h"

namespace fuselink::bench {

std::string NextRequestId(const std::string& tag) {
  static std::atomic<uint64_t> serial{0};
  return UniqueRequestId(tag, serial.fetch_add(1));
}

namespace {

// Metric `name` of each NIC of `agent` now, with `labels` besides the NIC's.
absl::StatusOr<std::vector<double>> PerNic(
    const NodeAgent& agent, const std::string& name,
    std::map<std::string, std::string> labels = {}) {
  FL_ASSIGN_OR_RETURN(std::string body,
                      client::HttpGet(agent.metrics_url, absl::Seconds(2)));
  std::vector<double> out;
  for (const std::string& nic : agent.nic_names) {
    labels["nic"] = nic;
    FL_ASSIGN_OR_RETURN(double v, client::MetricValue(body, name, labels));
    out.push_back(v);
  }
  return out;
}

// Borrowed bytes sent through each NIC of `agent` so far.
absl::StatusOr<std::vector<double>> BorrowedBytes(const NodeAgent& agent) {
  return PerNic(agent, "fuselink_nic_transmitted_bytes_total", {{"traffic", "borrowed"}});
}

// NIC-seconds the sending nodes' NICs sat idle while a transfer there waited
// (fuselink_nic_idle_while_demand_seconds_total, summed over `nodes` and their NICs).
absl::StatusOr<double> IdleWhileDemand(const Cluster& cluster,
                                       const std::vector<int>& nodes) {
  double sum = 0;
  for (int node : nodes) {
    FL_ASSIGN_OR_RETURN(
        std::vector<double> idle,
        PerNic(cluster.nodes[node], "fuselink_nic_idle_while_demand_seconds_total"));
    sum = std::accumulate(idle.begin(), idle.end(), sum);
  }
  return sum;
}

std::string Shares(const std::vector<uint64_t>& bytes) {
  const uint64_t total = std::accumulate(bytes.begin(), bytes.end(), uint64_t{0});
  std::vector<std::string> pct;
  for (uint64_t b : bytes) pct.push_back(absl::StrCat(total ? 100 * b / total : 0));
  return absl::StrJoin(pct, "/");
}

}  // namespace

absl::Status WarmUp(Cluster& cluster) {
  const size_t n = cluster.nodes.size();
  for (size_t from = 0; from < n; ++from) {
    for (size_t to = 0; to < n; ++to) {
      if (from == to) continue;
      NodeAgent& a = cluster.nodes[from];
      NodeAgent& b = cluster.nodes[to];
      FL_ASSIGN_OR_RETURN(auto source, HomedTensor::Create(a, NextRequestId("warm"), 1, 8,
                                                           kMiB, 0, true));
      FL_ASSIGN_OR_RETURN(auto target, HomedTensor::Create(b, NextRequestId("warm"), 1, 8,
                                                           kMiB, 0, false));
      FL_RETURN_IF_ERROR(
          RunToEnd(a, BlockRequest(NextRequestId("warm"), *source, 0, *target, 0, 8))
              .status());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PolicyRow> HotWorkload(Cluster& c, const SchedOptions& o, Sampler& sampler,
                                      RunContext&) {
  constexpr uint32_t kLayers = 16;
  const uint32_t blocks =
      static_cast<uint32_t>(std::max<uint64_t>(1, o.hot_bytes / kLayers / kMiB));
  NodeAgent& a = c.nodes[0];
  FL_ASSIGN_OR_RETURN(auto source, HomedTensor::Create(a, NextRequestId("hot"), kLayers,
                                                       blocks, kMiB, 0, true));
  FL_ASSIGN_OR_RETURN(auto target, HomedTensor::Create(c.nodes[1], NextRequestId("hot"),
                                                       kLayers, blocks, kMiB, 0, false));
  FL_ASSIGN_OR_RETURN(std::vector<double> borrowed_before, BorrowedBytes(a));
  sampler.Start();
  FL_ASSIGN_OR_RETURN(
      TransferTimes t,
      RunToEnd(a, BlockRequest(NextRequestId("hot"), *source, 0, *target, 0, blocks)));
  sampler.Stop();
  FL_ASSIGN_OR_RETURN(std::vector<double> borrowed_after, BorrowedBytes(a));
  if (!BlocksMatch(*source, 0, *target, 0, blocks)) {
    return absl::DataLossError("hot: the target's bytes differ");
  }
  std::vector<std::string> borrowed_mib;
  for (size_t k = 0; k < borrowed_after.size(); ++k) {
    borrowed_mib.push_back(absl::StrCat(
        static_cast<int64_t>((borrowed_after[k] - borrowed_before[k]) / kMiB)));
  }
  std::vector<std::string> nic_mib;
  for (uint64_t b : t.nic_bytes) nic_mib.push_back(absl::StrCat(b / kMiB));
  const double gbps = static_cast<double>(source->bytes()) * 8 / t.seconds() / 1e9;
  PolicyRow row{Result("sched_hot"), gbps, true};
  row.result.Add("policy", c.policy)
      .Add("mib", static_cast<int64_t>(source->bytes() / kMiB))
      .Add("seconds", t.seconds())
      .Add("gbit_s", gbps)
      .Add("nic_share_pct", Shares(t.nic_bytes))
      .Add("nic_mib", absl::StrJoin(nic_mib, "/"))
      .Add("borrowed_mib", absl::StrJoin(borrowed_mib, "/"))
      .Add("verified", std::string("yes"));
  return row;
}

absl::StatusOr<std::unique_ptr<Borrowers>> Borrowers::Create(NodeAgent& from,
                                                             NodeAgent& to,
                                                             const SchedOptions& o) {
  const int k = std::max(1, o.owner_borrower_transfers);
  const auto blocks =
      static_cast<uint32_t>(std::max<uint64_t>(1, o.owner_borrower_bytes / k / kMiB));
  std::unique_ptr<Borrowers> b(new Borrowers(from, blocks));
  for (int i = 0; i < k; ++i) {
    FL_ASSIGN_OR_RETURN(auto s, HomedTensor::Create(from, NextRequestId("borrower"), 1,
                                                    blocks, kMiB, 0, true));
    FL_ASSIGN_OR_RETURN(auto t, HomedTensor::Create(to, NextRequestId("borrower"), 1,
                                                    blocks, kMiB, 0, false));
    b->sources_.push_back(std::move(s));
    b->targets_.push_back(std::move(t));
  }
  return b;
}

void Borrowers::Start() {
  for (size_t i = 0; i < sources_.size(); ++i) {
    threads_.emplace_back([this, i] {
      absl::StatusOr<TransferTimes> t =
          RunToEnd(from_, BlockRequest(NextRequestId("borrower"), *sources_[i], 0,
                                       *targets_[i], 0, blocks_));
      absl::MutexLock lock(&mu_);
      if (!t.ok() && status_.ok()) status_ = t.status();
    });
  }
}

absl::Status Borrowers::Join() {
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  absl::MutexLock lock(&mu_);
  return status_;
}

bool Borrowers::Verified() const {
  for (size_t i = 0; i < sources_.size(); ++i) {
    if (!BlocksMatch(*sources_[i], 0, *targets_[i], 0, blocks_)) return false;
  }
  return true;
}

absl::StatusOr<OwnerTensors> OwnerTensors::Create(NodeAgent& from, NodeAgent& to,
                                                  const SchedOptions& o) {
  OwnerTensors t;
  t.from = &from;
  t.blocks = static_cast<uint32_t>(std::max<uint64_t>(1, o.owner_bytes / kMiB));
  FL_ASSIGN_OR_RETURN(t.source, HomedTensor::Create(from, NextRequestId("owner"), 1,
                                                    t.blocks, kMiB, 1, true));
  FL_ASSIGN_OR_RETURN(t.target, HomedTensor::Create(to, NextRequestId("owner"), 1,
                                                    t.blocks, kMiB, 1, false));
  return t;
}

absl::StatusOr<double> OwnerSoloGbps(const Cluster& c, const OwnerTensors& owner,
                                     RunContext& context) {
  FL_ASSIGN_OR_RETURN(TransferTimes solo,
                      RunToEnd(*owner.from, owner.Request("owner-solo")));
  const double gbps = owner.bits() / solo.seconds() / 1e9;
  if (c.policy == "static") context.static_owner_solo_gbps = gbps;
  return gbps;
}

absl::StatusOr<PolicyRow> OwnerWorkload(Cluster& c, const SchedOptions& o,
                                        Sampler& sampler, RunContext& context) {
  NodeAgent& a = c.nodes[0];
  NodeAgent& b = c.nodes[1];
  FL_ASSIGN_OR_RETURN(std::unique_ptr<Borrowers> borrowers, Borrowers::Create(a, b, o));
  FL_ASSIGN_OR_RETURN(const OwnerTensors owner_tensors, OwnerTensors::Create(a, b, o));
  FL_ASSIGN_OR_RETURN(const double solo_gbps, OwnerSoloGbps(c, owner_tensors, context));
  const double nic_solo_gbps =
      context.static_owner_solo_gbps > 0 ? context.static_owner_solo_gbps : solo_gbps;

  const std::string rail1 = a.nic_names.at(1);
  auto scrape = [&](const std::string& name,
                    std::map<std::string, std::string> labels) -> double {
    absl::StatusOr<std::string> body = client::HttpGet(a.metrics_url, absl::Seconds(2));
    if (!body.ok()) return -1;
    absl::StatusOr<double> v = client::MetricValue(*body, name, labels);
    return v.ok() ? *v : -1;
  };
  const double gb_sum0 = scrape("fuselink_nic_give_back_seconds_sum", {{"nic", rail1}});
  const double gb_count0 =
      scrape("fuselink_nic_give_back_seconds_count", {{"nic", rail1}});
  const double gb_events0 =
      scrape("fuselink_nic_give_back_events_total", {{"nic", rail1}});

  sampler.Start();
  borrowers->Start();
  absl::SleepFor(o.owner_delay);
  // Borrowed bytes on the owner's NIC: once the give-back bound has passed (12 chunk
  // times: borrow_depth chunks, plus what the tbf queue and two busy cores add)
  // after the owner's transfer was accepted, and again when 80% of it has landed.
  const absl::Duration bound =
      absl::Seconds(12 * RailSeconds(o, static_cast<double>(o.chunk_bytes)));
  double borrowed_after_bound = -1, borrowed_near_end = -1;
  std::thread bound_probe;
  const std::map<std::string, std::string> rail1_borrowed = {{"nic", rail1},
                                                             {"traffic", "borrowed"}};
  absl::StatusOr<TransferTimes> owner_or =
      RunToEnd(a, owner_tensors.Request("owner"), [&](const v1::TransferEvent& e) {
        if (e.has_accepted()) {
          bound_probe = std::thread([&] {
            absl::SleepFor(bound);
            borrowed_after_bound =
                scrape("fuselink_nic_transmitted_bytes_total", rail1_borrowed);
          });
        }
        if (e.has_progress() && borrowed_near_end < 0 &&
            e.progress().bytes_done() * 10 >= e.progress().total_bytes() * 8) {
          borrowed_near_end =
              scrape("fuselink_nic_transmitted_bytes_total", rail1_borrowed);
        }
      });
  if (bound_probe.joinable()) bound_probe.join();
  const absl::Status borrowed = borrowers->Join();
  sampler.Stop();
  FL_RETURN_IF_ERROR(owner_or.status());
  FL_RETURN_IF_ERROR(borrowed);
  const TransferTimes& owner = *owner_or;
  if (!owner_tensors.Verified() || !borrowers->Verified()) {
    return absl::DataLossError("owner: a target's bytes differ");
  }

  const double gb_count =
      scrape("fuselink_nic_give_back_seconds_count", {{"nic", rail1}}) - gb_count0;
  const double gb_sum =
      scrape("fuselink_nic_give_back_seconds_sum", {{"nic", rail1}}) - gb_sum0;
  const double gb_events =
      scrape("fuselink_nic_give_back_events_total", {{"nic", rail1}}) - gb_events0;
  // The timeline: borrowed bytes on NIC 1 (node A), from the owner's acceptance to
  // the last read in which they still grew while the owner ran.
  double at_accept = 0, at_end = 0;
  absl::Time last_growth = owner.accepted;
  const std::vector<NicSample> samples = sampler.samples();
  for (const NicSample& s : samples) {
    if (s.node != 0) continue;
    if (s.at <= owner.accepted) at_accept = s.borrowed_bytes[1];
    if (s.at <= owner.completed) at_end = s.borrowed_bytes[1];
  }
  double previous = at_accept;
  for (const NicSample& s : samples) {
    if (s.node != 0 || s.at <= owner.accepted || s.at > owner.completed) continue;
    if (s.borrowed_bytes[1] > previous) last_growth = s.at;
    previous = s.borrowed_bytes[1];
  }
  const double chunk_s = RailSeconds(o, static_cast<double>(o.chunk_bytes));
  const double owner_gbps = owner_tensors.bits() / owner.seconds() / 1e9;
  const double mean_give_back_s = gb_count > 0 ? gb_sum / gb_count : 0;
  const double timeline_s = absl::ToDoubleSeconds(last_growth - owner.accepted);
  PolicyRow row{Result("sched_owner"), owner_gbps / nic_solo_gbps, true};
  row.result.Add("policy", c.policy)
      .Add("owner_gbit_s", owner_gbps)
      .Add("solo_gbit_s", solo_gbps)
      .Add("pct_of_own_nic_solo", 100 * owner_gbps / nic_solo_gbps)
      .Add("borrowed_mib_on_nic1_while_owner",
           (at_end - at_accept) / static_cast<double>(kMiB))
      .Add("give_backs", static_cast<int64_t>(gb_events))
      .Add("give_back_ms", 1e3 * mean_give_back_s)
      .Add("give_back_chunks", mean_give_back_s / chunk_s)
      .Add("timeline_ms", 1e3 * timeline_s)
      .Add("timeline_chunks", timeline_s / chunk_s)
      .Add("probe_after_bound", static_cast<int64_t>(borrowed_after_bound))
      .Add("probe_near_end", static_cast<int64_t>(borrowed_near_end))
      .Add("verified", std::string("yes"));
  return row;
}

WorkloadFn FindSchedWorkload(const std::string& name) {
  if (name == "hot") return HotWorkload;
  if (name == "serving") return ServingWorkload;
  if (name == "expert") return ExpertWorkload;
  if (name == "dlrm") return DlrmWorkload;
  if (name == "owner") return OwnerWorkload;
  if (name == "owner_rx") return OwnerReceivesWorkload;
  return nullptr;
}

absl::StatusOr<std::vector<Result>> RunSchedWorkload(const std::string& name,
                                                     const SchedOptions& options) {
  const WorkloadFn workload = FindSchedWorkload(name);
  if (workload == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("no workload ", name));
  }
  RunContext context;
  std::vector<PolicyRow> rows;
  // The nodes that send are read: every node in the all-to-alls, the prefill half in
  // serving, node A otherwise.
  const bool all = name == "expert" || name == "dlrm";
  std::vector<int> sampled = {0};
  if (all || name == "serving") {
    sampled.resize(all ? options.nodes : options.nodes / 2);
    std::iota(sampled.begin(), sampled.end(), 0);
  }
  // The owner workloads time a give-back: finer reads, and no ratio to static.
  const bool owner_kind = name == "owner" || name == "owner_rx";
  const absl::Duration period =
      owner_kind ? absl::Milliseconds(20) : options.sample_period;
  for (const std::string& policy : options.policies) {
    FL_ASSIGN_OR_RETURN(Cluster cluster, LoadCluster(options.cluster_dir, policy,
                                                     options.nodes, absl::Seconds(10)));
    FL_RETURN_IF_ERROR(WarmUp(cluster));
    Sampler sampler(cluster, sampled, period);
    FL_ASSIGN_OR_RETURN(const double idle_before, IdleWhileDemand(cluster, sampled));
    absl::StatusOr<PolicyRow> row = workload(cluster, options, sampler, context);
    if (!row.ok()) {
      return absl::Status(row.status().code(), absl::StrCat(name, " under ", policy, ": ",
                                                            row.status().message()));
    }
    FL_ASSIGN_OR_RETURN(const double idle_after, IdleWhileDemand(cluster, sampled));
    row->result.Add("idle_nic_s", idle_after - idle_before);
    if (!options.out_dir.empty()) {
      sampler.WriteRates(absl::StrCat(options.out_dir, "/", name, "-", policy, ".dat"));
    }
    rows.push_back(*std::move(row));
  }
  double static_key = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (options.policies[i] == "static") static_key = rows[i].key;
  }
  std::vector<Result> out;
  for (PolicyRow& row : rows) {
    const double ratio = static_key <= 0 || row.key <= 0 ? 0
                         : row.higher_is_better          ? row.key / static_key
                                                         : static_key / row.key;
    if (!owner_kind) row.result.Add("x_static", ratio);
    out.push_back(std::move(row.result));
  }
  if (!options.out_dir.empty() && !options.png.empty()) {
    const std::string title = sampled.size() > 1
                                  ? absl::StrCat(name, ": Gbit/s per NIC, sends of ",
                                                 sampled.size(), " nodes summed")
                                  : absl::StrCat(name, ": Gbit/s per NIC of node A");
    const double rail_gbps = options.rail_bytes_per_s * 8 / 1e9;
    const double top = sampled.size() > 1 ? (sampled.size() + 0.5) : 1.5;
    if (PlotRates(options.out_dir, name, options.policies, options.nics, title,
                  top * rail_gbps, options.png) != 0) {
      std::fprintf(stderr, "fuselink-bench: gnuplot failed for %s\n",
                   options.png.c_str());
    }
  }
  return out;
}

}  // namespace fuselink::bench
