// The source side of transfers. The engine wires the parts and owns their threads;
// each part keeps one job (docs/design.md, "The source engine"):
//  - admission.h: what a request must be, checked on its own;
//  - transfer_registry.h: admission against the bound, idempotency on request id,
//    the live jobs and the finished ones kept for GetTransfer;
//  - preparer.h: what the target is asked to prepare, and the plan from its answer;
//  - job.h: one transfer's state machine, from admission to the target's verdict;
//  - window.h: one transfer's chunks on the fabric, its failover and back-pressure;
//  - verdict_wait.h: when a source that heard no verdict asks for it;
//  - wait_list.h, timer_queue.h, worker_pool.h: waking jobs that wait for room, the
//    jobs' timers, and the threads for calls that block.
// Threads: the fabric's (completions, arrivals); `prepare_threads` for the blocking
// calls to remote targets (PrepareIncoming, QueryVerdict), in a lane per target of
// which one target holds at most `prepare_threads_per_target`; kInNodePrepareThreads
// of their own for in-node prepares and questions, which so never wait behind a
// remote target; one relay worker (GPU fences, relay pool growth) and one
// housekeeping thread (timers, the scheduler's look, the forgetting of finished
// transfers). In all prepare_threads + kInNodePrepareThreads + 2. Nothing blocks on a
// fabric thread or under a transfer's lock.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/common/stats.h"
#include "agent/fabric/fabric.h"
#include "agent/memory/registry.h"
#include "agent/relay/pool.h"
#include "agent/sched/scheduler.h"
#include "agent/topo/topology.h"
#include "agent/transfer/job.h"
#include "agent/transfer/peer_link.h"
#include "agent/transfer/timer_queue.h"
#include "agent/transfer/transfer.h"
#include "agent/transfer/transfer_registry.h"
#include "agent/transfer/verdict_wait.h"
#include "agent/transfer/wait_list.h"
#include "agent/transfer/worker_pool.h"

namespace fuselink::transfer {

// Threads for in-node prepares: they ask this node's own landing, which answers from
// memory, and never wait for a peer.
inline constexpr int kInNodePrepareThreads = 1;

struct EngineOptions {
  std::string node;
  // Bytes per fabric write; kMinChunkBytes to kMaxChunkBytes.
  uint32_t chunk_bytes = 4u << 20;
  // Chunks one transfer keeps in flight, over all NICs; 1 to kMaxWindowChunks.
  uint32_t window_chunks = 16;
  // Transfers preparing or running at once; past it Submit is RESOURCE_EXHAUSTED.
  // At least 1.
  size_t max_active_transfers = 64;
  // Of them, one requester's at once (RegistryOptions::max_active_per_requester); at
  // least 1, and may pass max_active_transfers (then only that bounds it).
  size_t max_active_transfers_per_requester = 32;
  // Finished transfers kept for GetTransfer and idempotent retries.
  size_t max_finished_kept = 4096;
  absl::Duration finished_kept_for = absl::Minutes(10);
  // Progress events at most this often per transfer.
  absl::Duration progress_interval = absl::Milliseconds(50);
  // Threads that call remote targets (PrepareIncoming, QueryVerdict; each blocks on
  // one call at a time), shared by the targets; 1 to kMaxPoolThreads.
  int prepare_threads = 8;
  // Of those, the most one target's calls hold at once: a target that hangs delays
  // its own transfers, never another's. 1 to prepare_threads.
  int prepare_threads_per_target = 2;
  // One target's calls queued or running; past it the transfer that would queue
  // fails RESOURCE_EXHAUSTED (PREPARE_QUEUE_FULL), counted in prepares_refused().
  // 0: 2 x max_active_transfers, which is never reached (a job has at most one call
  // queued and one running), so every transfer admitted may target one node, as a
  // decode node's do; a smaller bound refuses such a node's ordinary load. Else at
  // least prepare_threads_per_target.
  size_t prepare_queue_per_target = 0;
  // Waiting for, and asking for, the target's verdict.
  VerdictWaitOptions verdict;
  // A job waiting for room with nothing in flight tries again this often.
  absl::Duration wait_backstop = absl::Milliseconds(20);
  // How long an abort notice may wait for room in full queues.
  absl::Duration abort_patience = absl::Seconds(2);
  // How long a decided transfer waits for its writes in flight before it closes the
  // connections to its target (JobOptions::drain_bound); 1 ms to kMaxTimeoutMs.
  absl::Duration drain_bound = absl::Seconds(10);
  // Off in tests that drive time themselves through Tick.
  bool housekeeping_thread = true;
  // The engine's clock, for tests.
  std::function<absl::Time()> clock = [] { return absl::Now(); };
  // Moves whose target is this node: an in-node lane (fabric/in_node_fabric.h) as
  // the fabric's peer this node, and peers that prepare this node (services'
  // LocalRoute). Off: such a request is UNIMPLEMENTED (LOCAL_TARGET).
  bool in_node_moves = false;
  // Bytes per in-node copy: large, since a copy costs a GPU launch, not a NIC's queue
  // place, and holds no staging memory.
  uint32_t in_node_chunk_bytes = 64u << 20;
  // Told the end of every transfer this node sent (its outgoing watch event), off the
  // engine's locks. May be empty.
  std::function<void(const v1::WatchEvent&)> on_outgoing;
  // Called when a transfer finds a NIC's connection to its target failed; never
  // blocks (the node asks for its sessions' repair now). Null: nothing.
  std::function<void()> on_nic_lost;

  // INVALID_ARGUMENT naming the first field out of the range its comment gives
  // (agent/common/options.h). The engine's constructor requires it.
  absl::Status Validate() const;
};

// What the engine reports as it happens (to metrics). Called off the engine's locks.
// Who asks for a transfer, as the services established it.
struct Requester {
  // Sent to the target, which checks it against the target tensor's writers. An
  // identical request from another requester is another request (REQUEST_ID_REUSED).
  std::string identity;
  // Whether it may move data out of the source tensor, checked on the pinned tensor.
  // Null: anyone may.
  std::function<absl::Status(const memory::TensorInfo&)> may_read;
};

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
  // `scheduler` picks each chunk's NIC; `gpu_relay` (null on nodes without GPUs)
  // stages GPU tensors' chunks for borrowed NICs; host tensors are sent straight from
  // the tensor on any NIC, borrowed or not (every NIC reads host memory). They, and
  // `observer` (may be null), outlive the engine.
  Engine(EngineOptions options, const topo::Topology& topology,
         memory::Registry* registry, fabric::Fabric* fabric, PeerLink* peers,
         sched::Scheduler* scheduler, relay::Pool* gpu_relay, EngineObserver* observer);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Checks the request and starts it, or returns the transfer an identical earlier
  // request of the same requester started. `call_deadline` bounds the transfer along
  // with the request's; a deadline already reached is DEADLINE_EXCEEDED (DEADLINE).
  absl::StatusOr<std::shared_ptr<Transfer>> Submit(const v1::TransferRequest& request,
                                                   absl::Time call_deadline,
                                                   const Requester& requester = {});
  // By transfer id, else by request id, among `requester`'s transfers (Requester::
  // identity). NOT_FOUND (UNKNOWN_TRANSFER), also for another requester's.
  absl::StatusOr<std::shared_ptr<Transfer>> Find(absl::string_view transfer_id,
                                                 absl::string_view request_id,
                                                 absl::string_view requester = "") const;
  // FAILED_PRECONDITION (TRANSFER_FINISHED) once it has ended, or once it is the
  // target's to end (committed, or refused).
  absl::Status Cancel(const std::shared_ptr<Transfer>& transfer);
  // Layers below `end` of a layer-by-layer transfer are ready (Job::SetLayersReady).
  absl::Status LayersReady(const std::shared_ptr<Transfer>& transfer, uint32_t end);
  // Renews the transfer's lease (Job::ExtendLease); INVALID_ARGUMENT (BAD_LEASE) past
  // kMaxLeaseMs.
  absl::Status ExtendLease(const std::shared_ptr<Transfer>& transfer, uint32_t lease_ms);

  // From the fabric; safe during and after Shutdown (the fabric's last flush).
  void OnCompletion(const fabric::Completion& completion);
  // The receiver `peer` says which of its NICs are idle (bit k: NIC k).
  void OnIdleNics(fabric::PeerId peer, uint32_t idle_mask);
  // A target's verdict notice (imm.h) from node `target_node`.
  void OnVerdict(absl::string_view target_node, uint32_t imm);
  // Resources may be free again (relay memory): the jobs that wait try again.
  void Kick() { KickWaiting(); }

  // Stops the transfers whose source is tensor `tensor_id` (TensorLease::id) with
  // `why`; they end once their chunks in flight are back. Transfers already committed
  // end with the target's verdict.
  void AbortTensor(uint64_t tensor_id, const absl::Status& why);

  // Admits nothing more (UNAVAILABLE, SHUTTING_DOWN), fails what runs with that,
  // and joins the engine's threads; posts nothing afterwards. Transfers with writes
  // in flight end as the fabric flushes them. Call before the fabric goes.
  void Shutdown();

  // Runs the timers due at `now`, the scheduler's look and idle sample, and the
  // forgetting of finished transfers. The housekeeping thread calls it; with
  // housekeeping_thread off, the caller does. One caller at a time.
  void Tick(absl::Time now);

  size_t active() const { return transfers_.active(); }
  // Submits refused because their requester held its share (TRANSFER_SHARE).
  uint64_t share_refusals() const { return transfers_.share_refusals(); }
  // Completions that named no write in flight, and verdicts that named no live
  // transfer: counted, and otherwise ignored.
  uint64_t stray_completions() const { return stray_completions_.load(); }
  uint64_t stray_verdicts() const { return stray_verdicts_.load(); }
  // Relay copies that failed on their GPU, seen when a slot was let go of.
  uint64_t fence_errors() const { return fence_errors_.load(); }
  // Decided transfers whose writes outlived drain_bound, so that the connections to
  // their target were closed.
  uint64_t forced_drains() const { return forced_drains_.load(); }
  // Calls to a target refused because its lane was full (PREPARE_QUEUE_FULL): the
  // transfer failed, or a question about its verdict went unasked.
  uint64_t prepares_refused() const {
    return preparers_.refused() + in_node_preparers_.refused();
  }

  // Transfers running, strays, fence errors, forced drains, refusals.
  void ReportStats(stats::Sink& sink) const;

 private:
  using JobPtr = std::shared_ptr<Job>;
  using Event = absl::FunctionRef<void(Job& job, JobEffects* fx)>;
  using StatusEvent = absl::FunctionRef<absl::Status(Job& job, JobEffects* fx)>;

  // Runs `event` on `job` under its lock, then what the job asked for; lists the job
  // if it must wait, or runs it again at once if a kick came while it tried.
  void Run(const JobPtr& job, Event event);
  void Apply(const JobPtr& job, JobEffects& fx);
  // Runs `event` on the job of `transfer` and returns what it says: a caller's call on
  // one transfer (cancel, layers ready, lease). NOT_FOUND once the job is forgotten.
  absl::Status OnJob(const std::shared_ptr<Transfer>& transfer, StatusEvent event);
  void PrepareJob(const JobPtr& job);
  // Asks the target (its session up) to accept `job`, on a preparer thread.
  void Prepare(const JobPtr& job, IncomingSpec spec);
  // Queues `call` in the lane of `target_node`: in-node prepares' own, else that
  // target's. KeyedPool::Post's codes.
  absl::Status PostPeerCall(const std::string& target_node, KeyedPool::Task call);
  void AskVerdict(const JobPtr& job, absl::Time deadline);
  // Asks the job's target, by `deadline`, whether its agent still answers; the job
  // hears the answer (Job::OnProbeReply).
  void ProbeTarget(const JobPtr& job, absl::Time deadline);
  void ReleaseAfterFence(const relay::Slot& slot);
  void GrowRelay(int nic);
  void KickWaiting();
  void HousekeepingLoop();
  absl::Time now() const { return options_.clock(); }

  const EngineOptions options_;
  const topo::Topology topology_;
  memory::Registry* const registry_;
  PeerLink* const peers_;
  sched::Scheduler* const scheduler_;
  relay::Pool* const gpu_relay_;
  EngineObserver* const observer_;
  const std::vector<std::string> nic_names_;
  const std::string id_prefix_;

  JobContext ctx_;
  // In-node moves: one lane, always the job's own (never borrowed, nothing relayed).
  sched::Scheduler local_scheduler_;
  JobContext local_ctx_;
  TransferRegistry transfers_;
  WaitList<Job> waiting_;
  TimerQueue<Job> timers_;
  std::atomic<uint64_t> stray_completions_{0};
  std::atomic<uint64_t> stray_verdicts_{0};
  std::atomic<uint64_t> fence_errors_{0};
  std::atomic<uint64_t> forced_drains_{0};
  std::array<std::atomic<bool>, kMaxNics> growing_{};  // a growth is queued
  // Tick's own state: one caller at a time.
  absl::Time next_collect_;
  absl::Time last_active_;
  absl::Time last_tick_ = absl::InfinitePast();

  // Threads last: they stop before the state they use goes.
  KeyedPool preparers_;          // remote targets, a lane each
  KeyedPool in_node_preparers_;  // this node's own landing
  WorkerPool relay_worker_;
  std::thread housekeeping_;
};

}  // namespace fuselink::transfer
