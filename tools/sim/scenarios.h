// Scenarios past the testbed's workloads, on the link model of network.h: the paper's
// single-GPU curve (1..8 NICs), a prediction for a 64-node serving cluster, and the
// testbed's all-to-alls at 4 and 8 nodes. Each
// prints its table with the parameters it chose, and writes a gnuplot data file
// (whitespace columns, "-" where a figure is missing) into `dat_dir` when set.
#pragma once

#include <string>

#include "tools/sim/network.h"

namespace fuselink::sim {

struct ScenarioOptions {
  std::string dat_dir;        // empty: no data file
  double tolerance_pct = 10;  // for the checks a scenario has
  Receiver receiver = Receiver::kShared;
};

// One hot GPU sends to one GPU of another node, fuselink, for 1..8 NICs; beside the
// paper's figures. Returns false when a simulated figure at one of the paper's points
// (under the fitted NVLink rate) is more than `tolerance_pct` off.
bool PaperCurve(const ScenarioOptions& options);

// 32 prefill nodes push KV caches to 32 decode nodes, under every policy: the
// transfer part of time to first token and NIC utilisation. Returns true.
bool Cluster64(const ScenarioOptions& options);

// PaperCurve's hot GPU on three kinds of node: the paper's (NVLink), one without
// NVLink whose relay copies cross PCIe, host bridges and the socket link, and one
// whose tensor is in host memory. Prints the table; returns true.
bool PcieTree(const ScenarioOptions& options);

// The testbed's expert and DLRM all-to-alls at 4 and 8 nodes, every policy, beside the
// measured fuselink / stripe; under both receiver models, and fuselink also without
// the receiver's marks. Returns false when the options' receiver model puts a
// fuselink / stripe more than `tolerance_pct` outside the measured range.
bool AllToAllNodes(const ScenarioOptions& options);

}  // namespace fuselink::sim
