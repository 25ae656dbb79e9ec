// The source side of transfers: admission, the target's acceptance, and the pipeline
// that cuts extents into chunks and keeps a bounded window of them in flight on the
// NICs the scheduler picks. Memory per transfer is bounded by its extents and window,
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
#include "agent/relay/relay_pool.h"
#include "agent/sched/scheduler.h"
#include "agent/topo/topology.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/peer_link.h"
#include "agent/transfer/plan.h"
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

// What the engine reports as it happens (to metrics). Called off the engine's locks.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void OnTransferFinished(State state, absl::Duration elapsed,
                                  uint64_t bytes) = 0;
  // A returning owner waited `waited` for borrowed chunks to leave NIC `nic`.
  virtual void OnGiveBack(int nic, absl::Duration waited) = 0;
};

class Engine {
 public:
  // `scheduler` picks each chunk's NIC; `relay` stages host tensors' chunks for
  // borrowed NICs, `gpu_relay` (null on nodes without GPUs) GPU tensors'. They, and
  // `observer` (may be null), outlive the engine.
  Engine(EngineOptions options, const topo::Topology& topology,
         memory::Registry* registry, fabric::Fabric* fabric, PeerLink* peers,
         sched::Scheduler* scheduler, relay::Pool* relay, relay::Pool* gpu_relay,
         EngineObserver* observer);
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
  // The receiver `peer` says which of its NICs are idle (bit k: NIC k).
  void OnIdleNics(fabric::PeerId peer, uint32_t idle_mask);
  // A target's verdict notice (imm.h) from node `target_node`.
  void OnVerdict(absl::string_view target_node, uint32_t imm);
  // Resources may be free again (relay memory): pumps the jobs that wait.
  void Kick() { KickWaiting(); }

  // Stops the transfers whose source is tensor `tensor_id` (TensorLease::id) with
  // `why`; they end once their chunks in flight are back.
  void AbortTensor(uint64_t tensor_id, const absl::Status& why);

  // Stops posting and fails what runs, UNAVAILABLE. Call before the fabric goes.
  void Shutdown();

  size_t active() const;

 private:
  struct Job;
  struct InFlight {
    Job* job = nullptr;
    Chunk chunk;
    sched::Choice choice;
    relay::Slot relay;            // valid when the chunk was staged for a borrowed NIC
    relay::Pool* pool = nullptr;  // the relay slot's
  };
  using JobPtr = std::shared_ptr<Job>;

  void PrepareLoop();
  void HousekeepingLoop();
  void Prepare(const JobPtr& job);
  // Posts chunks while the window and the NICs have room.
  void PumpLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.transfer->mu());
  // NIC `nic` no longer reaches the job's target. False when it was the last: the
  // job is then stopped.
  bool NicFailedLocked(Job& job, int nic, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.transfer->mu());
  // Posts a zero-byte notice with `op` on a usable NIC, tracked by `tracked` (null:
  // untracked). False when no NIC took it.
  bool PostNoticeLocked(Job& job, ImmOp op, InFlight* tracked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.transfer->mu());
  // Stops a running job with `why`; it ends once its chunks drain.
  void StopLocked(Job& job, absl::Status why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.transfer->mu());
  // Ends a stopped or finished job whose chunks have drained. Returns true if it
  // reached a final state now.
  bool MaybeFinishLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.transfer->mu());
  void Finished(Job& job);
  // Lists a job no NIC could take a chunk of; it is pumped after a completion.
  void Wait(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.transfer->mu());
  // Pumps the jobs that waited for a NIC; called after any completion.
  void KickWaiting();
  // Gives the chunk's relay slot back; `sent`: its write completed.
  void ReleaseRelay(InFlight& f, bool sent);
  // The jobs that have not finished.
  std::vector<JobPtr> LiveJobsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops a preparing or running job with `why`. FAILED_PRECONDITION
  // (TRANSFER_FINISHED) when it is already ending.
  absl::Status StopJob(const JobPtr& job, absl::Status why);
  absl::StatusOr<JobPtr> Admit(const v1::TransferRequest& request,
                               absl::Time call_deadline);

  const EngineOptions options_;
  const topo::Topology topology_;
  memory::Registry* const registry_;
  fabric::Fabric* const fabric_;
  PeerLink* const peers_;
  sched::Scheduler* const scheduler_;
  relay::Pool* const relay_;
  relay::Pool* const gpu_relay_;
  EngineObserver* const observer_;
  const std::vector<std::string> nic_names_;
  const std::string id_prefix_;
  std::atomic<int> waiting_count_{0};
  // Jobs no NIC could take a chunk of. A leaf lock: taken under a transfer's.
  absl::Mutex waiting_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<JobPtr> waiting_ ABSL_GUARDED_BY(waiting_mu_);

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
