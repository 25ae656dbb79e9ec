#include "tools/sim/workloads.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>

namespace fuselink::sim {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// hot: GPU 0 of node 0 sends 1 GiB to GPU 0 of node 1; the others are idle.
Outcome Hot(const NetworkModel& model, uint64_t* chunks) {
  Network net(model);
  const std::vector<FlowResult> r = net.Run({Flow{0, 0, 1, 1024 * kMiB, 0}});
  *chunks += net.chunks();
  return {r[0].seconds(), -1, net.idle_while_demand_s()};
}

double LastEnd(const std::vector<FlowResult>& r, size_t begin, size_t end) {
  double last = 0;
  for (size_t i = begin; i < end; ++i) last = std::max(last, r[i].end_s);
  return last;
}

Outcome Expert(const NetworkModel& model, uint64_t* chunks) {
  Network net(model);
  const std::vector<FlowResult> r =
      net.Run(AllToAll(2, model.nics, {188, 376, 125, 62, 47, 75, 53, 94}));
  *chunks += net.chunks();
  return {LastEnd(r, 0, r.size()), -1, net.idle_while_demand_s()};
}

// DLRM-like: eight workers' lookups to the other node's four, both ways; an iteration
// lasts as long as its slowest worker.
Outcome Dlrm(const NetworkModel& model, uint64_t* chunks) {
  Network net(model);
  const std::vector<FlowResult> r =
      net.Run(AllToAll(2, model.nics, {43, 73, 74, 23, 88, 64, 35, 108}));
  *chunks += net.chunks();
  return {LastEnd(r, 0, r.size()), -1, net.idle_while_demand_s()};
}

// Disaggregated serving, as fuselink-bench draws it (seed 1): four prefill instances
// (GPUs 0-3 of node 0) push KV caches to four decode instances (node 1); Poisson
// arrivals at 1.5/s per instance for 20 s, lognormal prompts (median 1024 tokens,
// sigma 1, at most 4096) of 16 KiB per token; each instance has 4 request slots, and
// a request that finds them all busy waits. Its time: from arrival to completion; the
// median of all requests.
Outcome Serving(const NetworkModel& model, uint64_t* chunks) {
  constexpr int kInstances = 4, kSlots = 4;
  constexpr uint64_t kTokensPerBlock = 16, kBlockBytes = 16 * 1024 * kTokensPerBlock;
  struct Arrival {
    double at_s;
    uint64_t bytes;
  };
  std::vector<std::vector<Arrival>> arrivals(kInstances);
  for (int i = 0; i < kInstances; ++i) {
    std::mt19937_64 rng(1 * 1000 + i);
    std::exponential_distribution<double> gap(1.5);
    std::lognormal_distribution<double> tokens(std::log(1024.0), 1.0);
    for (double t = gap(rng); t < 20; t += gap(rng)) {
      const double n = std::clamp(tokens(rng), 1.0, 4096.0);
      arrivals[i].push_back(
          {t, static_cast<uint64_t>(std::ceil(n / kTokensPerBlock)) * kBlockBytes});
    }
  }
  // Flow f serves request arrival_of[f] of instance instance_of[f].
  std::vector<int> instance_of;
  std::vector<size_t> arrival_of, next(kInstances, 0);
  std::vector<Flow> first;
  // The next request of instance i for a slot free from `free_at`, if any is left.
  auto take = [&](int i, double free_at) -> std::optional<Flow> {
    if (next[i] >= arrivals[i].size()) return std::nullopt;
    const Arrival& a = arrivals[i][next[i]];
    instance_of.push_back(i);
    arrival_of.push_back(next[i]++);
    return Flow{0, i, 1, a.bytes, std::max(a.at_s, free_at)};
  };
  for (int i = 0; i < kInstances; ++i) {
    for (int slot = 0; slot < kSlots; ++slot) {
      if (std::optional<Flow> flow = take(i, 0)) first.push_back(*flow);
    }
  }
  Network net(model);
  const std::vector<FlowResult> r = net.Run(first, [&](size_t flow, Network& n) {
    if (std::optional<Flow> next_flow = take(instance_of[flow], n.now()))
      n.Add(*next_flow);
  });
  *chunks += net.chunks();
  const double idle = net.idle_while_demand_s();
  std::vector<double> completion;
  for (size_t f = 0; f < r.size(); ++f) {
    completion.push_back(r[f].end_s - arrivals[instance_of[f]][arrival_of[f]].at_s);
  }
  std::sort(completion.begin(), completion.end());
  return {completion.empty() ? 0 : completion[(completion.size() - 1) / 2], -1, idle};
}

// owner: GPU 0 streams 8 transfers of 128 MiB; 1 s later GPU 1, the owner of NIC 1,
// sends 128 MiB. Its throughput against the same transfer alone on its own NIC.
Outcome Owner(const NetworkModel& model, uint64_t* chunks) {
  NetworkModel solo_model = model;
  solo_model.policy = sched::Policy::kStatic;
  Network solo(solo_model);
  const double solo_s = solo.Run({Flow{0, 1, 1, 128 * kMiB, 0}})[0].seconds();
  std::vector<Flow> flows;
  for (int i = 0; i < 8; ++i) flows.push_back(Flow{0, 0, 1, 128 * kMiB, 0});
  flows.push_back(Flow{0, 1, 1, 128 * kMiB, 1.0});
  Network net(model);
  const std::vector<FlowResult> r = net.Run(flows);
  *chunks += net.chunks() + solo.chunks();
  return {r.back().seconds(), 100 * solo_s / r.back().seconds(),
          net.idle_while_demand_s()};
}

}  // namespace

const std::vector<Workload>& Workloads() {
  static const std::vector<Workload> all = {
      {"hot", "the transfer", Hot, 4.001, 3.984},
      {"serving", "a request, p50", Serving, 3.065, 3.073},
      {"expert", "the all-to-all", Expert, 1.959, 1.969},
      {"dlrm", "the slowest worker", Dlrm, 1.457, 1.441},
      {"owner", "the owner's transfer", Owner, 0.734, 0.992},
  };
  return all;
}

std::vector<Flow> AllToAll(int nodes, int nics, const std::vector<uint64_t>& mib) {
  std::vector<Flow> flows;
  const int gpus = nodes * nics, receivers = (nodes - 1) * nics;
  for (int s = 0; s < gpus; ++s) {
    const uint64_t each = std::max<uint64_t>(1, mib[s] / receivers) * kMiB;
    for (int r = 0; r < gpus; ++r) {
      if (r / nics == s / nics) continue;
      flows.push_back(Flow{s / nics, s % nics, r / nics, each, 0, r % nics});
    }
  }
  return flows;
}

}  // namespace fuselink::sim
