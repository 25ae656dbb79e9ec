// fuselink-bench: named workloads against two running agents, the source and the
// target. Prints a table, or with --json one JSON object per result.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "agent/common/status_macros.h"
#include "tools/bench/sched_main.h"
#include "tools/bench/workloads.h"

ABSL_FLAG(std::string, workload, "transfer",
          "transfer or rpc; the scheduler workloads: hot, serving, expert, dlrm, owner, "
          "owner_rx.");
ABSL_FLAG(std::string, source_agent, "127.0.0.1:50051",
          "The source agent's gRPC address.");
ABSL_FLAG(std::string, target_agent, "127.0.0.1:50052",
          "The target agent's gRPC address.");
ABSL_FLAG(std::string, source_socket, "/run/fuselink/node-a.sock",
          "The source agent's handle socket.");
ABSL_FLAG(std::string, target_socket, "/run/fuselink/node-b.sock",
          "The target agent's handle socket.");
ABSL_FLAG(bool, json, false, "One JSON object per result instead of a table.");
ABSL_FLAG(int, connect_timeout_s, 10, "How long to wait for the agents to answer.");
// transfer
ABSL_FLAG(uint32_t, layers, 32, "transfer: layers of the tensor.");
ABSL_FLAG(uint32_t, blocks, 128, "transfer: blocks per layer.");
ABSL_FLAG(uint64_t, block_bytes, 256 << 10, "transfer: bytes per block.");
ABSL_FLAG(int, reps, 5, "transfer: measured repetitions.");
ABSL_FLAG(int, warmup, 1, "transfer: unmeasured repetitions first.");
ABSL_FLAG(bool, verify, true, "transfer: memcmp the target against the source once.");
ABSL_FLAG(int, new_memory_reps, 0,
          "transfer: then this many transfers, each into newly registered tensors.");
// rpc
ABSL_FLAG(uint32_t, rpc_blocks, 1, "rpc: blocks per call.");
ABSL_FLAG(uint64_t, rpc_block_bytes, 4096, "rpc: bytes per block.");
ABSL_FLAG(int, rpc_calls, 2000, "rpc: sequential calls for the latency percentiles.");
ABSL_FLAG(std::string, concurrency, "1,4,16",
          "rpc: concurrent callers, one result each.");
ABSL_FLAG(double, rpc_seconds, 3, "rpc: how long each concurrency level runs.");

namespace {

using namespace fuselink::bench;

absl::StatusOr<std::vector<Result>> RunFromFlags(const std::string& workload) {
  if (IsSchedWorkload(workload)) return RunSchedFromFlags(workload);
  if (workload != "transfer" && workload != "rpc") {
    return absl::InvalidArgumentError(
        "--workload must be transfer, rpc, hot, serving, expert, dlrm, owner or "
        "owner_rx");
  }
  FL_ASSIGN_OR_RETURN(
      Agents agents,
      ConnectAgents(absl::GetFlag(FLAGS_source_agent), absl::GetFlag(FLAGS_source_socket),
                    absl::GetFlag(FLAGS_target_agent), absl::GetFlag(FLAGS_target_socket),
                    absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s))));
  if (workload == "transfer") {
    TransferOptions options;
    options.layers = absl::GetFlag(FLAGS_layers);
    options.blocks_per_layer = absl::GetFlag(FLAGS_blocks);
    options.block_bytes = absl::GetFlag(FLAGS_block_bytes);
    options.repetitions = absl::GetFlag(FLAGS_reps);
    options.warmup = absl::GetFlag(FLAGS_warmup);
    options.verify = absl::GetFlag(FLAGS_verify);
    options.new_memory_reps = absl::GetFlag(FLAGS_new_memory_reps);
    return RunTransferWorkload(agents, options);
  }
  RpcOptions options;
  options.blocks_per_call = absl::GetFlag(FLAGS_rpc_blocks);
  options.block_bytes = absl::GetFlag(FLAGS_rpc_block_bytes);
  options.calls = absl::GetFlag(FLAGS_rpc_calls);
  options.duration = absl::Seconds(absl::GetFlag(FLAGS_rpc_seconds));
  options.concurrency.clear();
  for (absl::string_view k : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    int callers = 0;
    if (!absl::SimpleAtoi(k, &callers)) {
      return absl::InvalidArgumentError("--concurrency wants numbers, e.g. 1,4,16");
    }
    options.concurrency.push_back(callers);
  }
  return RunRpcWorkload(agents, options);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "fuselink-bench --workload=transfer|rpc --source_agent=HOST:PORT "
      "--source_socket=PATH --target_agent=HOST:PORT --target_socket=PATH [--json]\n"
      "fuselink-bench --workload=hot|serving|expert|dlrm|owner|owner_rx "
      "--cluster_dir=DIR "
      "--policies=P,... --rail_bytes_per_s=N [--json]  (scripts/bench-testbed.sh)");
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<std::vector<Result>> results =
      RunFromFlags(absl::GetFlag(FLAGS_workload));
  if (!results.ok()) {
    std::fprintf(stderr, "fuselink-bench: %s\n", results.status().ToString().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) {
    for (const Result& r : *results) std::printf("%s\n", ToJson(r).c_str());
  } else {
    std::printf("%s", ToTable(*results).c_str());
  }
  return 0;
}
