// The scheduler workloads of fuselink-bench (tools/bench/sched_workloads.cc), as flows
// for the simulator, with the bytes the namespace-testbed run of docs/benchmarks.md
// drew, and the measured ratios they are validated against (the run of
// 2026-12-02 16:24 UTC, docs/benchmarks.md, "Issue 15").
#pragma once

#include <string>
#include <vector>

#include "tools/sim/network.h"

namespace fuselink::sim {

// One workload's figure of merit under one policy (smaller is better: seconds), and
// for the owner workload the owner's share of its NIC's solo rate.
struct Outcome {
  double seconds = 0;
  double owner_pct = -1;           // owner: % of its transfer's static solo rate; else -1
  double idle_while_demand_s = 0;  // Network::idle_while_demand_s, over its runs
};

struct Workload {
  std::string name;
  std::string metric;  // whose seconds `Outcome::seconds` are
  // Its result under `model.policy`.
  Outcome (*run)(const NetworkModel& model, uint64_t* chunks);
  // Measured on the namespace testbed (docs/benchmarks.md): static / policy.
  double measured_x_stripe, measured_x_fuselink;
};

const std::vector<Workload>& Workloads();

// An all-to-all as fuselink-bench runs it (expert, DLRM): GPU g sends mib[g] MiB
// (rounded down to whole MiB per receiver, at least 1), split evenly over every GPU of
// the other nodes, all at once.
std::vector<Flow> AllToAll(int nodes, int nics, const std::vector<uint64_t>& mib);

}  // namespace fuselink::sim
