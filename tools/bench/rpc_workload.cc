// --workload=rpc: many small transfers. Sequential calls give the latency from the
// call's start to its first event (`accepted`: the target has reserved a slot) and
// to its last (`completed`); K callers, each running one call after another, give
// the rate of completed transfers.
#include <algorithm>
#include <atomic>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "tools/bench/workloads.h"

namespace fuselink::bench {
namespace {

// Callers at most; the agent admits 64 transfers at once by default
// (--max_transfers), 32 of them one router's (--max_transfers_per_router: past 32
// callers, run the agents with more), and each caller has its own blocks of the
// tensor.
constexpr int kMaxCallers = 64;

struct CallTimes {
  absl::Duration accepted;
  absl::Duration completed;
};

absl::StatusOr<CallTimes> Call(Agents& agents, const TensorPair& tensor,
                               const std::vector<uint32_t>& blocks,
                               const std::string& request_id) {
  const v1::TransferRequest request = tensor.Request(request_id, blocks);
  CallTimes times;
  bool first = true;
  const absl::Time start = absl::Now();
  client::TransferOutcome outcome =
      client::RunTransfer(*agents.source.stub, request, [&](const v1::TransferEvent&) {
        if (first) times.accepted = absl::Now() - start;
        first = false;
      });
  times.completed = absl::Now() - start;
  if (!outcome.status.ok()) return outcome.status;
  if (!outcome.last.has_completed()) {
    return absl::AbortedError(absl::StrCat(
        "transfer ", request_id, " did not complete: ", outcome.last.failed().message()));
  }
  return times;
}

// Blocks [first, first + count).
std::vector<uint32_t> Range(uint32_t first, uint32_t count) {
  std::vector<uint32_t> ids(count);
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

double Micros(absl::Duration d) { return absl::ToDoubleMicroseconds(d); }

absl::StatusOr<Result> Latency(Agents& agents, const TensorPair& tensor,
                               const RpcOptions& options) {
  std::vector<double> accepted_us, completed_us;
  const std::vector<uint32_t> blocks = Range(0, options.blocks_per_call);
  for (int i = 0; i < options.calls; ++i) {
    FL_ASSIGN_OR_RETURN(CallTimes t,
                        Call(agents, tensor, blocks, UniqueRequestId("rpc-seq", i)));
    accepted_us.push_back(Micros(t.accepted));
    completed_us.push_back(Micros(t.completed));
  }
  const Summary a = Summarize(std::move(accepted_us));
  const Summary c = Summarize(std::move(completed_us));
  Result r("rpc_latency");
  r.Add("bytes_per_call",
        static_cast<int64_t>(options.blocks_per_call * options.block_bytes))
      .Add("calls", static_cast<int64_t>(a.count))
      .Add("accepted_p50_us", a.median)
      .Add("accepted_p99_us", a.p99)
      .Add("accepted_max_us", a.max)
      .Add("completed_p50_us", c.median)
      .Add("completed_p99_us", c.p99);
  return r;
}

absl::StatusOr<Result> Rate(Agents& agents, const TensorPair& tensor,
                            const RpcOptions& options, int callers) {
  std::atomic<int64_t> completed{0};
  absl::Mutex mu;
  absl::Status first_error;  // guarded by mu
  std::vector<double> completed_us[kMaxCallers];
  const absl::Time start = absl::Now();
  const absl::Time end = start + options.duration;
  std::vector<std::thread> threads;
  for (int k = 0; k < callers; ++k) {
    threads.emplace_back([&, k] {
      // Disjoint target blocks: no two callers land on the same block at once.
      const std::vector<uint32_t> blocks =
          Range(k * options.blocks_per_call, options.blocks_per_call);
      for (int64_t i = 0; i == 0 || absl::Now() < end; ++i) {  // at least one call
        absl::StatusOr<CallTimes> t =
            Call(agents, tensor, blocks,
                 UniqueRequestId(absl::StrCat("rpc-", callers, "-", k), i));
        if (!t.ok()) {
          absl::MutexLock lock(&mu);
          if (first_error.ok()) first_error = t.status();
          return;
        }
        completed_us[k].push_back(Micros(t->completed));
        completed.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  {
    absl::MutexLock lock(&mu);
    if (!first_error.ok()) return first_error;
  }
  std::vector<double> all_us;
  for (int k = 0; k < callers; ++k) {
    all_us.insert(all_us.end(), completed_us[k].begin(), completed_us[k].end());
  }
  const Summary c = Summarize(std::move(all_us));
  Result r("rpc_rate");
  r.Add("callers", int64_t{callers})
      .Add("seconds", seconds)
      .Add("transfers", completed.load())
      .Add("transfers_per_s", static_cast<double>(completed.load()) / seconds)
      .Add("completed_p50_us", c.median)
      .Add("completed_p99_us", c.p99);
  return r;
}

}  // namespace

absl::StatusOr<std::vector<Result>> RunRpcWorkload(Agents& agents,
                                                   const RpcOptions& options) {
  int most_callers = 1;
  for (int k : options.concurrency) {
    if (k < 1 || k > kMaxCallers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--concurrency values must be 1 to ", kMaxCallers));
    }
    most_callers = std::max(most_callers, k);
  }
  if (options.blocks_per_call < 1 || options.calls < 1) {
    return absl::InvalidArgumentError("--rpc_blocks and --rpc_calls must be at least 1");
  }
  v1::Layout layout;
  layout.set_layers(1);
  layout.set_blocks_per_layer(options.blocks_per_call * most_callers);
  layout.set_block_bytes(options.block_bytes);
  FL_ASSIGN_OR_RETURN(auto tensor,
                      TensorPair::Create(agents, UniqueRequestId("rpc", 0), layout));
  std::vector<Result> results;
  FL_ASSIGN_OR_RETURN(Result latency, Latency(agents, *tensor, options));
  results.push_back(std::move(latency));
  for (int k : options.concurrency) {
    FL_ASSIGN_OR_RETURN(Result rate, Rate(agents, *tensor, options, k));
    results.push_back(std::move(rate));
  }
  if (!tensor->TargetMatchesSource()) {
    return absl::DataLossError("the target's bytes differ from the source's");
  }
  return results;
}

}  // namespace fuselink::bench
