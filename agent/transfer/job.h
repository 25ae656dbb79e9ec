// One transfer at its source, from admission to its end: the state machine that
// decides when and how it ends. The window (window.h) moves the chunks; the job
// prepares, commits, hears the target's verdict and ends.
//
// The rules it keeps (docs/design.md, "The source engine"):
//  - The target decides. A transfer completes only on the target's kCompleted
//    verdict, after the source committed; any other verdict ends it with that
//    verdict's code and reason. The commit's own acknowledgement decides nothing.
//  - A job ends only once none of its writes is in flight (their wr_ids name it).
//    Once decided, it waits at most JobOptions::drain_bound for them; then it closes
//    the connections to its target, which fails them (and so frees its memory only
//    once no write of it can still read it).
//  - The source decides only before it committed: a cancel, a deadline, the source
//    tensor's owner exiting or the last NIC failing ends it with the source's reason
//    (and a best-effort abort tells the target). Once the commit is out, or a write
//    was refused, only the verdict — asked for when it does not come
//    (verdict_wait.h) — or the agent's shutdown ends it.
//  - A full queue delays the commit and the abort; it never fails the transfer.
// Every method is called with the transfer's lock held; what must not run under it
// goes into JobEffects for the engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/fabric/fabric.h"
#include "agent/memory/registry.h"
#include "agent/relay/pool.h"
#include "agent/sched/scheduler.h"
#include "agent/transfer/failover.h"
#include "agent/transfer/job_effects.h"
#include "agent/transfer/peer_link.h"
#include "agent/transfer/plan.h"
#include "agent/transfer/transfer.h"
#include "agent/transfer/verdict_wait.h"
#include "agent/transfer/window.h"

namespace fuselink::transfer {

struct JobOptions {
  uint32_t chunk_bytes = 4u << 20;
  uint32_t window_chunks = 16;  // at most kMaxWindowChunks
  VerdictWaitOptions verdict;
  // A job that waits for room with nothing in flight tries again this often,
  // whatever else wakes it.
  absl::Duration wait_backstop = absl::Milliseconds(20);
  // How long an abort notice may wait for room in full queues before it is dropped
  // (the target also ends a silent transfer on its own).
  absl::Duration abort_patience = absl::Seconds(2);
  // How long a decided job's writes may stay in flight before it closes the fabric's
  // connections to its target (Fabric::Disconnect), which fails them: its end is so
  // bounded whatever the target or the network does with them.
  absl::Duration drain_bound = absl::Seconds(10);
};

// What every job of an engine shares. Outlives the jobs.
struct JobContext {
  fabric::Fabric* fabric = nullptr;
  sched::Scheduler* scheduler = nullptr;
  relay::Pool* gpu_relay = nullptr;  // null on nodes without one
  // The NICs the jobs' writes may take: the fabric's, or the one lane of in-node moves.
  int lanes = 0;
  std::string transport;  // what the transfer's status names: the fabric's, or "local"
  JobOptions options;
  std::function<absl::Time()> clock = [] { return absl::Now(); };
  // Set by Engine::Shutdown: nothing is posted afterwards.
  std::atomic<bool> posting_stopped{false};
};

class Job {
 public:
  // The commit's window entry; data entries are 0 .. window_chunks - 1.
  uint16_t commit_entry() const {
    return static_cast<uint16_t>(ctx_->options.window_chunks);
  }

  Job(uint32_t serial, std::shared_ptr<Transfer> transfer, memory::TensorLease source,
      int direct_nic, JobContext* ctx, std::string requester = {});
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  uint32_t serial() const { return serial_; }
  const std::shared_ptr<Transfer>& transfer() const { return transfer_; }
  absl::Mutex& mu() const ABSL_LOCK_RETURNED(transfer_->mu()) { return transfer_->mu(); }
  const std::string& target_node() const { return transfer_->request().target().node(); }
  int direct_nic() const { return direct_nic_; }
  const memory::Layout& source_layout() const { return source_layout_; }
  const std::string& requester() const { return requester_; }

  // --- Events; each ends by settling the job (posting what it can, ending it when it
  // is decided and drained). ---

  // A prepare thread takes the job: the spec to send, or nullopt when the job ended
  // meanwhile (stopped, or its deadline passed).
  std::optional<IncomingSpec> BeginPrepare(JobEffects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // The target's answer, and the extents planned from it (preparer.h).
  void OnPrepared(absl::StatusOr<Prepared> prepared,
                  absl::StatusOr<std::vector<Extent>> plan, JobEffects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // A completion whose wr_id names this job. False when it names no write in flight.
  bool OnCompletion(uint16_t entry, uint16_t seq, const fabric::Completion& completion,
                    JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // The target's verdict notice (verdict.h).
  void OnVerdict(uint8_t verdict, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // The answer to the question JobEffects::query asked for.
  void OnVerdictReply(const absl::StatusOr<std::optional<absl::Status>>& reply,
                      JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // The answer to the question JobEffects::probe asked: whether the target's agent
  // still answers (OK, or an error from the target) or not (DEADLINE_EXCEEDED,
  // UNAVAILABLE: the target is stopped or gone, and the transfer ends PEER_LOST).
  void OnProbeReply(const absl::Status& reply, JobEffects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // The job's timer (timer()) is due.
  void OnTimer(JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // Woken from the wait list: something it waited for may be free.
  void Resume(JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // Settles the job with no event (a new job sets its deadline's timer so).
  void Refresh(JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // The source stops the job with `why`. FAILED_PRECONDITION (TRANSFER_FINISHED) when
  // it has ended or is ending, or (unless `force`: shutdown) when the target decides
  // it now.
  absl::Status Stop(absl::Status why, bool force, JobEffects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // The receiver's idle NICs, from its notices.
  void SetRemoteIdle(uint32_t mask) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // Layer by layer: layers below `end` may be sent now (LayersReady's errors).
  absl::Status SetLayersReady(uint32_t end, JobEffects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // The lease (TransferRequest.lease_ms) now runs out `lease_ms` from now (0: the
  // request's own), never sooner than before. FAILED_PRECONDITION: NO_LEASE without
  // one, TRANSFER_FINISHED once it has ended or is ending. Once committed the lease
  // no longer matters, and renewing it changes nothing.
  absl::Status ExtendLease(uint32_t lease_ms, JobEffects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());

  // --- Queries. ---
  bool accepted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) { return accepted_; }
  bool done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) { return phase_ == Phase::kDone; }
  bool UsesTensor(uint64_t tensor_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // The target's peer id, once it accepted.
  std::optional<fabric::PeerId> peer() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // When OnTimer is due; InfiniteFuture for never.
  absl::Time timer() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) { return timer_; }
  // The timer the engine last set for the job; the engine's to read and write.
  absl::Time scheduled_timer ABSL_GUARDED_BY(mu()) = absl::InfiniteFuture();

 private:
  enum class Phase {
    kPreparing,      // waiting for the target to accept
    kSending,        // the window moves the data
    kCommitting,     // every chunk landed: the commit goes, then the verdict comes
    kTargetDecides,  // a write was refused (or the commit's NICs failed): only the
                     // verdict, or the question for it, ends the job
    kDone,
  };
  enum class AbortState { kNone, kPending, kSent, kDropped };

  // Posts what can be posted and ends the job once it is decided and drained.
  void Settle(JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // Takes the window's trouble into the job's decision.
  void TakeTrouble(JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  void PostCommit(JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  void PostAbort(JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  void Finish(JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // Decides the job's end; it ends once drained. `abort`: tell the target.
  void Decide(absl::Status outcome, bool abort, JobEffects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // The target will decide: wait for its verdict (or ask), with `fallback`.
  void AwaitVerdict(VerdictWait::Why why, absl::Status fallback)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // The status of a verdict (or an answer) from the target.
  absl::Status FromTarget(absl::Status verdict) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  bool SourceMayStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // What the source's outgoing watches hear of the job's end.
  v1::WatchEvent OutgoingEvent(const absl::Status& outcome) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  uint32_t in_flight() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // Of those, the writes on the fabric (not the target's preparing call).
  uint32_t writes_in_flight() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // Decided, with writes on the fabric, and no connection closed for them yet: they
  // have until drain_until_.
  bool DrainPending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  absl::Time now() const { return ctx_->clock(); }

  const uint32_t serial_;
  const std::shared_ptr<Transfer> transfer_;
  const int direct_nic_;
  JobContext* const ctx_;
  const memory::Layout source_layout_;
  const std::string requester_;  // who asked for it (Requester::identity)

  memory::TensorLease source_ ABSL_GUARDED_BY(mu());
  Phase phase_ ABSL_GUARDED_BY(mu()) = Phase::kPreparing;
  bool prepare_running_ ABSL_GUARDED_BY(mu()) = false;
  bool accepted_ ABSL_GUARDED_BY(mu()) = false;           // the transfer started here
  std::optional<Prepared> target_ ABSL_GUARDED_BY(mu());  // the target reserved a slot
  NicReach reach_ ABSL_GUARDED_BY(mu());
  std::optional<Window> window_ ABSL_GUARDED_BY(mu());
  bool listed_ ABSL_GUARDED_BY(mu()) = false;  // on the engine's wait list
  // A write saw no ACK for the fabric's bound, and the target is being asked whether
  // it still answers: nothing is posted until it replies. A target stopped dead then
  // costs one ACK bound and one question, not one ACK bound per NIC in turn.
  bool probing_ ABSL_GUARDED_BY(mu()) = false;
  // Starts the question to the target when a write came back with no ACK
  // (JobEffects::target_silent) and none is out.
  void AskIfSilent(JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu());
  // Layers below this are ready to send: the request's end, unless layer by layer.
  uint32_t ready_end_ ABSL_GUARDED_BY(mu());
  // When the lease runs out; InfiniteFuture without one.
  absl::Time lease_until_ ABSL_GUARDED_BY(mu()) = absl::InfiniteFuture();

  bool commit_posted_ ABSL_GUARDED_BY(mu()) = false;  // ever: the target may decide
  bool commit_in_flight_ ABSL_GUARDED_BY(mu()) = false;
  bool commit_landed_ ABSL_GUARDED_BY(mu()) = false;
  uint16_t commit_seq_ ABSL_GUARDED_BY(mu()) = 0;
  int commit_nic_ ABSL_GUARDED_BY(mu()) = -1;

  bool verdict_seen_ ABSL_GUARDED_BY(mu()) = false;  // the target ended its slot
  VerdictWait wait_ ABSL_GUARDED_BY(mu());
  std::optional<absl::Status> outcome_ ABSL_GUARDED_BY(mu());  // decided: drain, end
  absl::Time drain_until_ ABSL_GUARDED_BY(mu()) = absl::InfiniteFuture();
  bool drain_forced_ ABSL_GUARDED_BY(mu()) = false;  // the connections were closed
  bool abort_owed_ ABSL_GUARDED_BY(mu()) = false;
  AbortState abort_ ABSL_GUARDED_BY(mu()) = AbortState::kNone;
  absl::Time abort_until_ ABSL_GUARDED_BY(mu()) = absl::InfiniteFuture();
  absl::Time timer_ ABSL_GUARDED_BY(mu()) = absl::InfiniteFuture();
};

// INTERNAL (TARGET_PROTOCOL): the target said the transfer completed before the
// source committed it.
absl::Status EarlyVerdictStatus(absl::string_view target_node);

}  // namespace fuselink::transfer
