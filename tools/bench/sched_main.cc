// fuselink-bench --workload=hot|serving|expert|dlrm|owner|owner_rx: the scheduler
// workloads, each under every policy of --policies against agents
// scripts/bench-testbed.sh started (their ready files in --cluster_dir).
#include "tools/bench/sched_main.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "tools/bench/sched_workloads.h"

ABSL_FLAG(std::string, cluster_dir, "",
          "sched: folder of the agents' ready files, <policy>-n<i>.json.");
ABSL_FLAG(std::string, policies, "static,stripe,fuselink", "sched: policies, in order.");
ABSL_FLAG(std::string, out_dir, "", "sched: where the rate timelines go; empty: none.");
ABSL_FLAG(std::string, png, "", "sched: the plot; needs --out_dir.");
ABSL_FLAG(uint64_t, chunk_bytes, 1 << 20, "sched: the agents' --chunk_bytes.");
ABSL_FLAG(double, rail_bytes_per_s, 125e6, "sched: one rail's rate.");
ABSL_FLAG(int, sample_ms, 100, "sched: metrics read period (owner: 20 ms).");
ABSL_FLAG(uint32_t, seed, 1, "sched: seed of every random draw.");
ABSL_FLAG(int, nodes, 2, "sched: testbed nodes (agents per policy).");
ABSL_FLAG(uint64_t, hot_bytes, 1ull << 30, "hot: bytes of the tensor.");
ABSL_FLAG(double, serving_seconds, 20, "serving: how long requests arrive.");
ABSL_FLAG(double, serving_arrivals_per_s, 1.5, "serving: arrivals per instance.");
ABSL_FLAG(uint32_t, max_tokens, 4096, "serving: prompt length cap.");
ABSL_FLAG(uint64_t, kv_bytes_per_token, 16 << 10, "serving: KV cache bytes per token.");
ABSL_FLAG(uint64_t, expert_bytes, 1ull << 30, "expert: bytes of the all-to-all.");
ABSL_FLAG(uint64_t, dlrm_bytes, 64ull << 20,
          "dlrm: mean bytes per worker and iteration.");
ABSL_FLAG(int, dlrm_iterations, 3, "dlrm: iterations.");
ABSL_FLAG(uint64_t, owner_borrower_bytes, 1ull << 30,
          "owner, owner_rx: the borrower's bytes.");
ABSL_FLAG(uint64_t, owner_bytes, 128ull << 20, "owner, owner_rx: the owner's bytes.");
ABSL_FLAG(double, owner_delay_s, 1, "owner, owner_rx: seconds before the owner starts.");

namespace fuselink::bench {

bool IsSchedWorkload(const std::string& name) {
  return FindSchedWorkload(name) != nullptr;
}

absl::StatusOr<std::vector<Result>> RunSchedFromFlags(const std::string& workload) {
  SchedOptions o;
  o.cluster_dir = absl::GetFlag(FLAGS_cluster_dir);
  o.policies = absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipEmpty());
  o.out_dir = absl::GetFlag(FLAGS_out_dir);
  o.png = absl::GetFlag(FLAGS_png);
  o.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  o.rail_bytes_per_s = absl::GetFlag(FLAGS_rail_bytes_per_s);
  o.sample_period = absl::Milliseconds(absl::GetFlag(FLAGS_sample_ms));
  o.seed = absl::GetFlag(FLAGS_seed);
  o.nodes = absl::GetFlag(FLAGS_nodes);
  o.hot_bytes = absl::GetFlag(FLAGS_hot_bytes);
  o.serving_seconds = absl::GetFlag(FLAGS_serving_seconds);
  o.serving_arrivals_per_s = absl::GetFlag(FLAGS_serving_arrivals_per_s);
  o.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  o.kv_bytes_per_token = absl::GetFlag(FLAGS_kv_bytes_per_token);
  o.expert_bytes = absl::GetFlag(FLAGS_expert_bytes);
  o.dlrm_bytes = absl::GetFlag(FLAGS_dlrm_bytes);
  o.dlrm_iterations = absl::GetFlag(FLAGS_dlrm_iterations);
  o.owner_borrower_bytes = absl::GetFlag(FLAGS_owner_borrower_bytes);
  o.owner_bytes = absl::GetFlag(FLAGS_owner_bytes);
  o.owner_delay = absl::Seconds(absl::GetFlag(FLAGS_owner_delay_s));
  if (o.cluster_dir.empty() || o.policies.empty() || o.rail_bytes_per_s <= 0) {
    return absl::InvalidArgumentError(
        "--cluster_dir, --policies and --rail_bytes_per_s are needed");
  }
  if (o.nodes < 2 || o.nodes % 2 != 0) {
    return absl::InvalidArgumentError("--nodes must be even and at least 2");
  }
  return RunSchedWorkload(workload, o);
}

}  // namespace fuselink::bench
