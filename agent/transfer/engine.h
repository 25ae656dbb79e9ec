// The source side of transfers: admission, the target's acceptance, and the pipeline
// that cuts extents into chunks and keeps a bounded window of them in flight on the
// NICs the policy picks. Memory per transfer is bounded by its extents and window,
// never by the bytes it moves.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/fabric/fabric.h"
#include "agent/memory/registry.h"
#include "agent/topo/topology.h"
#include "agent/transfer/peer_link.h"
#include "agent/transfer/plan.h"
#include "agent/transfer/policy.h"
#include "agent/transfer/transfer.h"

namespace fuselink::transfer {

struct EngineOptions {
  std::string node;
  // Bytes per fabric write.
  uint32_t chunk_bytes = 4u << 20;
  // Chunks one transfer keeps in flight, over all NICs.
  uint32_t window_chunks = 16;
  // Transfers preparing or running at once; past it Submit is RESOURCE_EXHAUSTED.
  size_t max_active_transfers = 64;
  // Finished transfers kept for GetTransfer and idempotent retries.
  size_t max_finished_kept = 4096;
  absl::Duration finished_kept_for = absl::Minutes(10);
  // Progress events at most this often per transfer.
  absl::Duration progress_interval = absl::Milliseconds(50);
  // Threads that ask targets to accept (each blocks on one peer call).
  int prepare_threads = 2;
};

class Engine {
 public:
  // Called once per transfer that reached a final state, off the engine's locks.
  using FinishedFn =
      std::function<void(State state, absl::Duration elapsed, uint64_t bytes)>;

  Engine(EngineOptions options, const topo::Topology& topology,
         memory::Registry* registry, fabric::Fabric* fabric, PeerLink* peers,
         std::unique_ptr<Policy> policy, FinishedFn on_finished);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Checks the request and starts it, or returns the transfer an identical earlier
  // request started. `call_deadline` bounds the transfer along with the request's.
  absl::StatusOr<std::shared_ptr<Transfer>> Submit(const v1::TransferRequest& request,
                                                   absl::Time call_deadline);
  // By transfer id, else by request id. NOT_FOUND (UNKNOWN_TRANSFER).
  absl::StatusOr<std::shared_ptr<Transfer>> Find(absl::string_view transfer_id,
                                                 absl::string_view request_id) const;
  // FAILED_PRECONDITION (TRANSFER_FINISHED) once it has ended.
  absl::Status Cancel(const std::shared_ptr<Transfer>& transfer);

  // From the fabric.
  void OnCompletion(const fabric::Completion& completion);

  // Stops posting and fails what runs, UNAVAILABLE. Call before the fabric goes.
  void Shutdown();

  size_t active() const;
  const Policy& policy() const { return *policy_; }

 private:
  struct Job;
  struct InFlight {
    Job* job = nullptr;
    Chunk chunk;
    int nic = 0;
  };
  using JobPtr = std::shared_ptr<Job>;

  void PrepareLoop();
  void HousekeepingLoop();
  void Prepare(const JobPtr& job);
  // Posts chunks while the window and the NICs have room.
  void PumpLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.transfer->mu());
  // Stops a running job with `why`; it ends once its chunks drain.
  void StopLocked(Job& job, absl::Status why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.transfer->mu());
  // Ends a stopped or finished job whose chunks have drained. Returns true if it
  // reached a final state now.
  bool MaybeFinishLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.transfer->mu());
  void Finished(Job& job);
  absl::StatusOr<JobPtr> Admit(const v1::TransferRequest& request,
                               absl::Time call_deadline);

  const EngineOptions options_;
  const topo::Topology topology_;
  memory::Registry* const registry_;
  fabric::Fabric* const fabric_;
  PeerLink* const peers_;
  const std::unique_ptr<Policy> policy_;
  const FinishedFn on_finished_;
  const std::vector<std::string> nic_names_;
  const std::string id_prefix_;
  std::vector<std::atomic<uint32_t>> nic_in_flight_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, JobPtr> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, JobPtr> by_request_ ABSL_GUARDED_BY(mu_);
  std::deque<JobPtr> to_prepare_ ABSL_GUARDED_BY(mu_);
  size_t active_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::vector<std::thread> threads_;
};

}  // namespace fuselink::transfer
