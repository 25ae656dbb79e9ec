// --workload=transfer: one whole tensor from the source agent to the target agent,
// timed by the client from the call's start to its `completed` event.
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "tools/bench/workloads.h"

namespace fuselink::bench {
namespace {

struct Run {
  double wall_s = 0;   // client: call start to the completed event
  double agent_s = 0;  // the source agent's own count, Completed.seconds
  std::vector<uint64_t> nic_bytes;
};

absl::StatusOr<Run> TransferOnce(Agents& agents, const TensorPair& tensor,
                                 const std::vector<uint32_t>& blocks, uint64_t serial) {
  const v1::TransferRequest request =
      tensor.Request(UniqueRequestId("transfer", serial), blocks);
  Run run;
  const absl::Time start = absl::Now();
  client::TransferOutcome outcome =
      client::RunTransfer(*agents.source.stub, request, [&](const v1::TransferEvent& e) {
        if (!e.has_completed()) return;
        run.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
        run.agent_s = e.completed().seconds();
        for (const v1::NicBytes& n : e.completed().per_nic()) {
          run.nic_bytes.push_back(n.bytes());
        }
      });
  if (!outcome.status.ok()) return outcome.status;
  if (outcome.last.has_failed()) {
    return absl::Status(static_cast<absl::StatusCode>(outcome.last.failed().code()),
                        absl::StrCat("transfer failed: ", outcome.last.failed().message(),
                                     " (", outcome.last.failed().reason(), ")"));
  }
  if (!outcome.last.has_completed()) {
    return absl::InternalError("the transfer's stream ended without completed or failed");
  }
  return run;
}

// Each NIC's share of the bytes in percent, e.g. "25/25/25/25".
std::string NicShares(const std::vector<uint64_t>& nic_bytes) {
  const uint64_t total = std::accumulate(nic_bytes.begin(), nic_bytes.end(), uint64_t{0});
  std::vector<std::string> shares;
  for (uint64_t b : nic_bytes) {
    shares.push_back(absl::StrCat(total ? (100 * b + total / 2) / total : 0));
  }
  return absl::StrJoin(shares, "/");
}

}  // namespace

absl::StatusOr<std::vector<Result>> RunTransferWorkload(Agents& agents,
                                                        const TransferOptions& options) {
  if (options.repetitions < 1 || options.warmup < 0 || options.new_memory_reps < 0) {
    return absl::InvalidArgumentError(
        "--reps must be at least 1, --warmup and --new_memory_reps at least 0");
  }
  v1::Layout layout;
  layout.set_layers(options.layers);
  layout.set_blocks_per_layer(options.blocks_per_layer);
  layout.set_block_bytes(options.block_bytes);
  FL_ASSIGN_OR_RETURN(auto tensor,
                      TensorPair::Create(agents, UniqueRequestId("kv", 0), layout));
  std::vector<uint32_t> blocks(options.blocks_per_layer);
  std::iota(blocks.begin(), blocks.end(), 0);
  const double gb = static_cast<double>(tensor->bytes()) / 1e9;

  std::vector<double> gbps, agent_gbps;
  double cold_gbps = 0, cold_agent_gbps = 0;
  bool verified = false;
  std::string shares;
  for (int i = 0; i < options.warmup + options.repetitions; ++i) {
    absl::StatusOr<Run> run = TransferOnce(agents, *tensor, blocks, i);
    if (!run.ok()) return run.status();
    if (i == 0) {
      cold_gbps = gb / run->wall_s;
      cold_agent_gbps = run->agent_s > 0 ? gb / run->agent_s : 0;
      if (options.verify) {
        if (!tensor->TargetMatchesSource()) {
          return absl::DataLossError("the target's bytes differ from the source's");
        }
        verified = true;
      }
    }
    if (i < options.warmup) continue;
    gbps.push_back(gb / run->wall_s);
    agent_gbps.push_back(run->agent_s > 0 ? gb / run->agent_s : 0);
    shares = NicShares(run->nic_bytes);
  }
  // The earlier pair is let go first: one pair is mapped at a time.
  std::vector<double> new_memory_gbps, new_memory_agent_gbps;
  for (int i = 0; i < options.new_memory_reps; ++i) {
    tensor.reset();
    FL_ASSIGN_OR_RETURN(tensor,
                        TensorPair::Create(agents, UniqueRequestId("kv", i + 1), layout));
    absl::StatusOr<Run> run =
        TransferOnce(agents, *tensor, blocks, options.warmup + options.repetitions + i);
    if (!run.ok()) return run.status();
    if (options.verify && !tensor->TargetMatchesSource()) {
      return absl::DataLossError("the new target's bytes differ from the source's");
    }
    new_memory_gbps.push_back(gb / run->wall_s);
    new_memory_agent_gbps.push_back(run->agent_s > 0 ? gb / run->agent_s : 0);
  }
  const Summary wall = Summarize(gbps);
  const Summary agent = Summarize(agent_gbps);
  Result r("transfer");
  r.Add("nics", int64_t{agents.source.nics})
      .Add("bytes", static_cast<int64_t>(tensor->bytes()))
      .Add("layout", absl::StrCat(options.layers, "x", options.blocks_per_layer, "x",
                                  options.block_bytes))
      .Add("reps", static_cast<int64_t>(wall.count))
      .Add("gbps_median", wall.median)
      .Add("gbps_min", wall.min)
      .Add("gbps_max", wall.max)
      .Add("agent_gbps_median", agent.median)
      .Add("cold_gbps", cold_gbps)
      .Add("cold_agent_gbps", cold_agent_gbps)
      .Add("new_memory_gbps",
           new_memory_gbps.empty() ? 0 : Summarize(new_memory_gbps).median)
      .Add("new_memory_agent_gbps",
           new_memory_agent_gbps.empty() ? 0 : Summarize(new_memory_agent_gbps).median)
      .Add("nic_share_pct", shares)
      .Add("verified", std::string(verified ? "yes" : "no"));
  return std::vector<Result>{std::move(r)};
}

}  // namespace fuselink::bench
