// The scheduler workloads of fuselink-bench: each runs against the agents
// of one policy on the namespace testbed (N nodes, node 0 = A, node 1 = B; GPU k owns
// NIC k) and gives one row; RunSchedWorkload runs it for every policy in turn and adds
// the ratio to static.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tools/bench/report.h"
#include "tools/bench/sched_cluster.h"
#include "tools/bench/sched_timeline.h"

namespace fuselink::bench {

inline constexpr uint64_t kMiB = 1 << 20;

// A request id unique in this run, tagged `tag`: every scheduler workload's transfers.
std::string NextRequestId(const std::string& tag);

struct SchedOptions {
  // DIR/<policy>-n<i>.json: the ready files of each policy's agents.
  std::string cluster_dir;
  std::vector<std::string> policies = {"static", "stripe", "fuselink"};
  // Where the rate timelines (.dat), the gnuplot script and the PNG go; empty: none.
  std::string out_dir;
  std::string png;
  // The agents' --chunk_bytes and one rail's rate: a chunk time is their ratio.
  uint64_t chunk_bytes = 1 << 20;
  double rail_bytes_per_s = 125e6;
  absl::Duration sample_period = absl::Milliseconds(100);
  uint32_t seed = 1;
  int nics = 4;   // GPUs (and NICs) per node
  int nodes = 2;  // hot and owner use nodes 0 and 1; the others all of them

  // hot: one tensor from GPU 0 of A to GPU 0 of B.
  uint64_t hot_bytes = 1ull << 30;
  // serving: the first half of the nodes prefill, the others decode; each prefill
  // GPU is an instance whose requests go to the same GPU of a decode node drawn at
  // random (with two nodes: A's 4 GPUs to B's).
  double serving_seconds = 20;
  double serving_arrivals_per_s = 1.5;  // per instance, Poisson
  double prompt_tokens_median = 1024;   // lognormal
  double prompt_tokens_sigma = 1.0;
  uint32_t max_tokens = 4096;
  uint64_t kv_bytes_per_token = 16 << 10;
  // expert: bytes of the whole combine all-to-all, every node together.
  uint64_t expert_bytes = 1ull << 30;
  double expert_zipf_s = 1.0;
  // dlrm: mean bytes a worker sends per iteration.
  uint64_t dlrm_bytes = 64ull << 20;
  double dlrm_sigma = 0.6;
  int dlrm_iterations = 3;
  // owner: GPU 0 streams `owner_borrower_transfers` tensors (total
  // `owner_borrower_bytes`); `owner_delay` later GPU 1 sends `owner_bytes`.
  uint64_t owner_borrower_bytes = 1ull << 30;
  int owner_borrower_transfers = 8;
  uint64_t owner_bytes = 128ull << 20;
  absl::Duration owner_delay = absl::Seconds(1);
};

// owner and owner_rx: GPU 0 of node `from` streams `owner_borrower_transfers` tensors
// (`owner_borrower_bytes` in all) to GPU 0 of node `to`, a thread each, while an owner
// sends. Not copyable; joins its threads on destruction.
class Borrowers {
 public:
  static absl::StatusOr<std::unique_ptr<Borrowers>> Create(NodeAgent& from, NodeAgent& to,
                                                           const SchedOptions& o);
  ~Borrowers() { Join().IgnoreError(); }
  Borrowers(const Borrowers&) = delete;
  Borrowers& operator=(const Borrowers&) = delete;

  void Start();
  // Waits for every transfer; the first one's error.
  absl::Status Join();
  // Whether every target holds its source's bytes.
  bool Verified() const;

 private:
  Borrowers(NodeAgent& from, uint32_t blocks) : from_(from), blocks_(blocks) {}
  NodeAgent& from_;
  const uint32_t blocks_;
  std::vector<std::unique_ptr<HomedTensor>> sources_, targets_;
  std::vector<std::thread> threads_;
  absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// owner and owner_rx: the owner, GPU 1 of node `from`, sends `owner_bytes` to GPU 1 of
// node `to`.
struct OwnerTensors {
  static absl::StatusOr<OwnerTensors> Create(NodeAgent& from, NodeAgent& to,
                                             const SchedOptions& o);
  v1::TransferRequest Request(const std::string& tag) const {
    return BlockRequest(NextRequestId(tag), *source, 0, *target, 0, blocks);
  }
  double bits() const { return static_cast<double>(source->bytes()) * 8; }
  bool Verified() const { return BlocksMatch(*source, 0, *target, 0, blocks); }

  NodeAgent* from = nullptr;
  uint32_t blocks = 0;
  std::unique_ptr<HomedTensor> source, target;
};

// One policy's row, and the figure its ratio to static is taken on.
struct PolicyRow {
  Result result;
  double key = 0;
  bool higher_is_better = true;
};

// What a workload knows of the policies run before it in the same run.
struct RunContext {
  // owner, owner_rx: the owner alone under static, on its own NIC: one rail's rate.
  double static_owner_solo_gbps = 0;
};

// The owner alone under `c`'s policy, in Gbit/s; under static it is also noted in
// `context`.
absl::StatusOr<double> OwnerSoloGbps(const Cluster& c, const OwnerTensors& owner,
                                     RunContext& context);

using WorkloadFn = absl::StatusOr<PolicyRow> (*)(Cluster&, const SchedOptions&, Sampler&,
                                                 RunContext&);
absl::StatusOr<PolicyRow> HotWorkload(Cluster&, const SchedOptions&, Sampler&,
                                      RunContext&);
absl::StatusOr<PolicyRow> ServingWorkload(Cluster&, const SchedOptions&, Sampler&,
                                          RunContext&);
absl::StatusOr<PolicyRow> ExpertWorkload(Cluster&, const SchedOptions&, Sampler&,
                                         RunContext&);
absl::StatusOr<PolicyRow> DlrmWorkload(Cluster&, const SchedOptions&, Sampler&,
                                       RunContext&);
absl::StatusOr<PolicyRow> OwnerWorkload(Cluster&, const SchedOptions&, Sampler&,
                                        RunContext&);
absl::StatusOr<PolicyRow> OwnerReceivesWorkload(Cluster&, const SchedOptions&, Sampler&,
                                                RunContext&);

// hot, serving, expert, dlrm, owner or owner_rx; nullptr otherwise.
WorkloadFn FindSchedWorkload(const std::string& name);

// `name` under every policy of `options`, one row each, with `x_static` added.
absl::StatusOr<std::vector<Result>> RunSchedWorkload(const std::string& name,
                                                     const SchedOptions& options);

// Shared by the workloads: a small transfer each way so that every peer session is
// connected before anything is timed.
absl::Status WarmUp(Cluster& cluster);
// Seconds to move `bytes` over one rail.
inline double RailSeconds(const SchedOptions& o, double bytes) {
  return bytes / o.rail_bytes_per_s;
}

}  // namespace fuselink::bench
