// The named workloads of fuselink-bench. Each runs against two running agents and
// returns its results, or the first error that stopped it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/bench/report.h"
#include "tools/bench/session.h"

namespace fuselink::bench {

// One large transfer of a whole tensor, repeated.
struct TransferOptions {
  uint32_t layers = 32;
  uint32_t blocks_per_layer = 128;
  uint64_t block_bytes = 256 << 10;  // 32 x 128 x 256 KiB = 1 GiB
  // Unmeasured runs first; the first one also faults the tensor into the agents'
  // mappings, and is reported on its own as `cold_gbps`.
  int warmup = 1;
  int repetitions = 5;
  // Compare the target's bytes with the source's once, after the first transfer.
  bool verify = true;
  // After the measured runs, this many transfers each into a newly registered pair
  // of tensors, over the connections the earlier runs warmed: the first transfer's
  // cost of new memory apart from that of new connections (`new_memory_gbps`).
  int new_memory_reps = 0;
};
absl::StatusOr<std::vector<Result>> RunTransferWorkload(Agents& agents,
                                                        const TransferOptions& options);

// Many small transfers: the control path's latency and rate.
struct RpcOptions {
  uint32_t blocks_per_call = 1;
  uint64_t block_bytes = 4096;
  // Sequential calls for the latency percentiles.
  int calls = 2000;
  // Concurrent callers for the rate, one result each; each caller runs its own
  // calls one after another for `duration`.
  std::vector<int> concurrency = {1, 4, 16};
  absl::Duration duration = absl::Seconds(3);
};
absl::StatusOr<std::vector<Result>> RunRpcWorkload(Agents& agents,
                                                   const RpcOptions& options);

}  // namespace fuselink::bench
