// fuselink-sim: the agent's scheduler (agent/sched) played against modelled NICs, for
// the workloads of fuselink-bench under every policy, beside what the namespace
// testbed measured. --check exits 1 when a simulated ratio to static is more than
// --tolerance_pct off the measured one. --scenario=paper_curve, cluster64 and alltoall
// run the scenarios of scenarios.h instead (their parameters are their own and printed);
// paper_curve's --check fails when a figure at one of the paper's points is off,
// alltoall's when a fuselink / stripe is outside the testbed's range.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "tools/sim/scenarios.h"
#include "tools/sim/workloads.h"

ABSL_FLAG(double, rail_gbit_s, 0.956, "One rail's rate (the testbed's shaped rails).");
ABSL_FLAG(double, latency_us, 100, "One-way latency per chunk.");
ABSL_FLAG(uint64_t, chunk_bytes, 1 << 20, "The agents' --chunk_bytes.");
ABSL_FLAG(uint32_t, direct_depth, 8, "The agents' --direct_depth.");
ABSL_FLAG(uint32_t, borrow_depth, 2, "The agents' --borrow_depth.");
ABSL_FLAG(uint32_t, window_chunks, 16, "The agents' --window_chunks.");
ABSL_FLAG(bool, check, false, "Fail when a ratio is off the measured one.");
ABSL_FLAG(double, tolerance_pct, 10, "--check: how far off a ratio may be.");
ABSL_FLAG(std::string, scenario, "testbed",
          "testbed (the workloads beside the namespace testbed), paper_curve, "
          "cluster64, pcie_tree or alltoall.");
ABSL_FLAG(std::string, dat, "", "A folder for the scenario's gnuplot data file.");
ABSL_FLAG(std::string, receiver, "shared",
          "How a receiving NIC serves the chunks that senders send it: shared (its rate "
          "split between them, as TCP shares a port) or fifo (one at a time, in the "
          "order they were posted). alltoall prints both.");

namespace fuselink::sim {
namespace {

int Testbed(Receiver receiver) {
  NetworkModel model;
  model.receiver = receiver;
  model.rail_bytes_per_s = absl::GetFlag(FLAGS_rail_gbit_s) * 1e9 / 8;
  model.latency_s = absl::GetFlag(FLAGS_latency_us) * 1e-6;
  model.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  model.limits.direct_depth = absl::GetFlag(FLAGS_direct_depth);
  model.limits.borrow_depth = absl::GetFlag(FLAGS_borrow_depth);
  model.window_chunks = absl::GetFlag(FLAGS_window_chunks);
  const double tolerance = absl::GetFlag(FLAGS_tolerance_pct);
  std::printf(
      "2 nodes x 4 rails of %.3f Gbit/s, %.0f us, chunks of %lu B, window %u, "
      "direct_depth %u, borrow_depth %u, receiver %s\n",
      absl::GetFlag(FLAGS_rail_gbit_s), absl::GetFlag(FLAGS_latency_us),
      static_cast<unsigned long>(model.chunk_bytes), model.window_chunks,
      model.limits.direct_depth, model.limits.borrow_depth, ReceiverName(receiver));
  std::printf("%-8s %-9s %9s %10s %12s %8s %9s %10s  %s\n", "workload", "policy",
              "seconds", "x_static", "measured_x", "off_pct", "owner_pct", "idle_nic_s",
              "seconds of");
  bool ok = true;
  uint64_t chunks = 0;
  const auto wall_start = std::chrono::steady_clock::now();
  for (const Workload& w : Workloads()) {
    double static_s = 0;
    for (sched::Policy p :
         {sched::Policy::kStatic, sched::Policy::kStripe, sched::Policy::kFuselink}) {
      model.policy = p;
      const Outcome o = w.run(model, &chunks);
      if (p == sched::Policy::kStatic) static_s = o.seconds;
      const double x = static_s / o.seconds;
      const double measured = p == sched::Policy::kStatic   ? 1
                              : p == sched::Policy::kStripe ? w.measured_x_stripe
                                                            : w.measured_x_fuselink;
      const double off = 100 * (x / measured - 1);
      const bool within = std::fabs(off) <= tolerance;
      ok = ok && within;
      const std::string owner =
          o.owner_pct < 0 ? "-" : absl::StrFormat("%.1f", o.owner_pct);
      std::printf("%-8s %-9s %9.3f %10.3f %12.3f %+8.1f %9s %10.3f  %s%s\n",
                  w.name.c_str(), std::string(sched::PolicyName(p)).c_str(), o.seconds, x,
                  measured, off, owner.c_str(), o.idle_while_demand_s, w.metric.c_str(),
                  within ? "" : "  OFF");
    }
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start)
          .count();
  std::printf("%lu chunks simulated in %.3f s: %.2f M chunks/s\n",
              static_cast<unsigned long>(chunks), wall, chunks / wall / 1e6);
  if (absl::GetFlag(FLAGS_check) && !ok) {
    std::fprintf(stderr, "a simulated ratio is more than %.0f%% off the measured one\n",
                 tolerance);
    return 1;
  }
  return 0;
}

int Main() {
  const std::string scenario = absl::GetFlag(FLAGS_scenario);
  const std::string receiver = absl::GetFlag(FLAGS_receiver);
  if (receiver != "shared" && receiver != "fifo") {
    std::fprintf(stderr, "unknown --receiver '%s': shared or fifo\n", receiver.c_str());
    return 2;
  }
  const ScenarioOptions options{absl::GetFlag(FLAGS_dat),
                                absl::GetFlag(FLAGS_tolerance_pct),
                                receiver == "fifo" ? Receiver::kFifo : Receiver::kShared};
  if (scenario == "testbed") return Testbed(options.receiver);
  if (scenario == "cluster64") return Cluster64(options) ? 0 : 1;
  if (scenario == "pcie_tree") return PcieTree(options) ? 0 : 1;
  if (scenario == "alltoall") {
    const bool ok = AllToAllNodes(options);
    if (absl::GetFlag(FLAGS_check) && !ok) {
      std::fprintf(stderr, "a ratio is more than %.0f%% outside the measured range\n",
                   options.tolerance_pct);
      return 1;
    }
    return 0;
  }
  if (scenario == "paper_curve") {
    const bool ok = PaperCurve(options);
    if (absl::GetFlag(FLAGS_check) && !ok) {
      std::fprintf(stderr, "a figure is more than %.0f%% off the paper's\n",
                   options.tolerance_pct);
      return 1;
    }
    return 0;
  }
  std::fprintf(stderr,
               "unknown --scenario '%s': testbed, paper_curve, cluster64, pcie_tree or "
               "alltoall\n",
               scenario.c_str());
  return 2;
}

}  // namespace
}  // namespace fuselink::sim

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "fuselink-sim [--scenario=testbed|paper_curve|cluster64|pcie_tree|alltoall] "
      "[--check]: the "
      "scheduler, "
      "simulated");
  absl::ParseCommandLine(argc, argv);
  return fuselink::sim::Main();
}
