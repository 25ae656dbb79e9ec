#include "agent/transfer/engine.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_format.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/admission.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/preparer.h"
#include "agent/transfer/wr_id.h"

namespace fuselink::transfer {

// One bound on NICs for the topology, the scheduler's table and the idle masks.
static_assert(kIdleMaskBits >= kMaxNics);

namespace {

// The scheduler's owner states are looked at this often while transfers run, and for
// this long after the last one ended (so that they settle to idle).
constexpr absl::Duration kLookEvery = absl::Milliseconds(5);
constexpr absl::Duration kLookAfterLast = absl::Milliseconds(50);
// Finished transfers are forgotten this often.
constexpr absl::Duration kCollectEvery = absl::Seconds(1);

std::vector<std::string> NicNames(const topo::Topology& topology) {
  std::vector<std::string> names;
  for (const auto& nic : topology.nics()) names.push_back(nic.name());
  return names;
}

JobOptions MakeJobOptions(const EngineOptions& o) {
  JobOptions j;
  j.chunk_bytes = o.chunk_bytes;
  j.window_chunks = std::clamp<uint32_t>(o.window_chunks, 1, kMaxWindowChunks);
  j.verdict = o.verdict;
  j.wait_backstop = o.wait_backstop;
  j.abort_patience = o.abort_patience;
  j.drain_bound = o.drain_bound;
  return j;
}

KeyedPoolOptions PrepareLanes(const EngineOptions& o) {
  KeyedPoolOptions lanes;
  lanes.name = "calls to target";
  lanes.reason = reasons::kPrepareQueueFull;
  lanes.threads = o.prepare_threads;
  lanes.running_per_key = o.prepare_threads_per_target;
  // Never reached: a job has at most one call queued and one running (a question
  // it posts as its prepare returns).
  lanes.pending_total = 2 * o.max_active_transfers;
  lanes.pending_per_key = o.prepare_queue_per_target == 0
                              ? lanes.pending_total
                              : std::min(o.prepare_queue_per_target, lanes.pending_total);
  return lanes;
}

KeyedPoolOptions InNodeLane(const EngineOptions& o) {
  KeyedPoolOptions lane;
  lane.name = "in-node prepares on";
  lane.reason = reasons::kPrepareQueueFull;
  lane.threads = kInNodePrepareThreads;
  lane.running_per_key = kInNodePrepareThreads;
  // Never reached: a job has at most one call queued and one running.
  lane.pending_per_key = lane.pending_total = 2 * o.max_active_transfers;
  return lane;
}

}  // namespace

Engine::Engine(EngineOptions options, const topo::Topology& topology,
               memory::Registry* registry, fabric::Fabric* fabric, PeerLink* peers,
               sched::Scheduler* scheduler, relay::Pool* gpu_relay,
               EngineObserver* observer)
    : options_(std::move(options)),
      topology_(topology),
      registry_(registry),
      peers_(peers),
      scheduler_(scheduler),
      gpu_relay_(gpu_relay),
      observer_(observer),
      nic_names_(NicNames(topology)),
      id_prefix_(absl::StrFormat("%s-%08x-", options_.node,
                                 static_cast<uint32_t>(std::random_device{}()))),
      local_scheduler_(sched::Policy::kStatic, 1, sched::Limits{}),
      transfers_(RegistryOptions{
          .max_active = options_.max_active_transfers,
          .max_active_per_requester = options_.max_active_transfers_per_requester,
          .max_finished_kept = options_.max_finished_kept,
          .finished_kept_for = options_.finished_kept_for}),
      next_collect_(options_.clock() + kCollectEvery),
      last_active_(options_.clock()),
      preparers_(PrepareLanes(options_)),
      in_node_preparers_(InNodeLane(options_)),
      relay_worker_(1) {
  ctx_.fabric = fabric;
  ctx_.scheduler = scheduler;
  ctx_.gpu_relay = gpu_relay;
  ctx_.lanes = fabric->nic_count();
  ctx_.transport = std::string(fabric->transport());
  ctx_.options = MakeJobOptions(options_);
  ctx_.clock = options_.clock;
  local_ctx_.fabric = fabric;
  local_ctx_.scheduler = &local_scheduler_;
  local_ctx_.lanes = 1;
  local_ctx_.transport = "local";
  local_ctx_.options = ctx_.options;
  local_ctx_.options.chunk_bytes = std::max(options_.in_node_chunk_bytes, 1u);
  local_ctx_.clock = options_.clock;
  if (options_.housekeeping_thread) {
    housekeeping_ = std::thread([this] { HousekeepingLoop(); });
  }
}

Engine::~Engine() { Shutdown(); }

absl::StatusOr<std::shared_ptr<Transfer>> Engine::Submit(
    const v1::TransferRequest& request, absl::Time call_deadline,
    const Requester& requester) {
  const std::string& rid = request.request_id();
  FL_RETURN_IF_ERROR(CheckRequestId(rid));
  // A request id is its requester's own: nobody attaches to, or blocks, another's.
  const std::string key = TransferRegistry::RequestKey(requester.identity, rid);
  std::string fingerprint = Fingerprint(request);
  FL_ASSIGN_OR_RETURN(JobPtr existing, transfers_.Existing(key, fingerprint));
  if (existing != nullptr) return existing->transfer();
  FL_RETURN_IF_ERROR(CheckLeaseMs(request.lease_ms()));
  FL_RETURN_IF_ERROR(CheckNodes(request, options_.node, *peers_, options_.in_node_moves));
  const bool in_node = request.target().node() == options_.node;
  const absl::Time deadline = std::min(RequestDeadline(request), call_deadline);
  if (deadline <= now()) return DeadlineStatus();
  FL_ASSIGN_OR_RETURN(memory::TensorLease lease, PinSource(request, *registry_));
  if (requester.may_read) FL_RETURN_IF_ERROR(requester.may_read(lease.info()));
  // An in-node move's one lane is NIC 0 of its own context, named "local" in its
  // per-NIC split.
  const int direct_nic = in_node ? 0 : topo::DirectNic(topology_, lease.info().home_gpu);
  auto make = [&](uint32_t serial, uint64_t number) {
    auto transfer = std::make_shared<Transfer>(
        absl::StrCat(id_prefix_, number), request, std::move(fingerprint),
        in_node ? std::vector<std::string>{"local"} : nic_names_, deadline);
    return std::make_shared<Job>(serial, std::move(transfer), std::move(lease),
                                 direct_nic, in_node ? &local_ctx_ : &ctx_,
                                 requester.identity);
  };
  bool fresh = false;
  FL_ASSIGN_OR_RETURN(
      JobPtr job, transfers_.Admit(key, fingerprint, make, &fresh, requester.identity));
  if (!fresh) return job->transfer();  // raced an identical request
  Run(job, [](Job& j, JobEffects* fx)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { j.Refresh(fx); });
  if (absl::Status posted =
          PostPeerCall(request.target().node(), [this, job] { PrepareJob(job); });
      !posted.ok()) {
    Run(job, [&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
      j.Stop(posted, /*force=*/true, fx).IgnoreError();  // ends it
    });
  }
  return job->transfer();
}

void Engine::PrepareJob(const JobPtr& job) {
  std::optional<IncomingSpec> spec;
  Run(job, [&](Job& j, JobEffects* fx)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { spec = j.BeginPrepare(fx); });
  if (!spec) return;  // ended while it queued
  spec->requester = job->requester();
  if (!peers_->SessionUp(spec->target_node)) {
    // Not on this thread: a target that does not answer would hold it for the
    // bootstrap's timeout, and with it every transfer queued behind.
    const std::string target = spec->target_node;  // read before spec moves below
    const absl::Time deadline = spec->deadline;
    peers_->Bootstrap(
        target, deadline, [this, job, spec = *std::move(spec)](absl::Status up) mutable {
          const std::string node = spec.target_node;  // read before spec moves
          if (up.ok()) {
            up = PostPeerCall(node, [this, job, spec = std::move(spec)]() mutable {
              Prepare(job, std::move(spec));
            });
          }
          if (up.ok()) return;
          Run(job, [&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
            j.OnPrepared(up, absl::UnknownError("not prepared"), fx);
          });
        });
    return;
  }
  Prepare(job, *std::move(spec));
}

void Engine::Prepare(const JobPtr& job, IncomingSpec spec) {
  absl::StatusOr<Prepared> prepared = peers_->PrepareIncoming(spec);
  absl::StatusOr<std::vector<Extent>> plan = absl::UnknownError("not prepared");
  if (prepared.ok()) {
    // Planned here, off the lock: the extents grow with the request's blocks.
    plan = PlanTransfer(job->transfer()->request(), job->source_layout(), *prepared);
    transfers_.Accepted(job, job->target_node(), prepared->slot, prepared->incarnation);
  }
  Run(job, [&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
    j.OnPrepared(std::move(prepared), std::move(plan), fx);
  });
}

absl::Status Engine::PostPeerCall(const std::string& target_node, KeyedPool::Task call) {
  KeyedPool& lanes = target_node == options_.node ? in_node_preparers_ : preparers_;
  return lanes.Post(target_node, std::move(call));
}

void Engine::Run(const JobPtr& job, Event event) {
  for (bool first = true;; first = false) {
    JobEffects fx;
    const WaitList<Job>::Ticket ticket = waiting_.ticket();  // before it tries
    {
      absl::MutexLock lock(&job->mu());
      if (first) {
        event(*job, &fx);
      } else {
        job->Resume(&fx);
      }
      // Set under the job's lock, so that its timers are set in the order decided.
      if (job->timer() != job->scheduled_timer) {
        timers_.Set(job->serial(), job, job->timer());
        job->scheduled_timer = job->timer();
      }
    }
    Apply(job, fx);
    if (!fx.wait || waiting_.Enlist(job, ticket)) return;
    // A kick came while it tried: what it waits for may be free now.
  }
}

void Engine::Apply(const JobPtr& job, JobEffects& fx) {
  // The source tensor is let go of before anyone hears the transfer ended: a caller
  // that unregisters it at once must find it free.
  fx.released = memory::TensorLease();
  for (const relay::Slot& slot : fx.release_after_fence) ReleaseAfterFence(slot);
  for (int nic = 0; nic < kMaxNics; ++nic) {
    if (fx.grow_relay >> nic & 1) GrowRelay(nic);
  }
  if (fx.give_back_ns > 0 && observer_ != nullptr) {
    observer_->OnGiveBack(fx.give_back_nic, absl::Nanoseconds(fx.give_back_ns));
  }
  if (fx.finished) {
    transfers_.Finished(job, fx.free_request_id, now());  // the requester's share
    job->transfer()->ReleaseEnd();                        // the end may be heard now
    if (observer_ != nullptr) {
      observer_->OnTransferFinished(fx.final_state, fx.elapsed, fx.total_bytes);
    }
  }
  if (fx.outgoing && options_.on_outgoing) options_.on_outgoing(*fx.outgoing);
  if (fx.nic_lost && options_.on_nic_lost) options_.on_nic_lost();
  if (fx.notify) job->transfer()->Notify(fx.progress_only, options_.progress_interval);
  if (fx.query) AskVerdict(job, fx.query_deadline);
  if (fx.probe) ProbeTarget(job, fx.probe_deadline);
  if (fx.disconnect) {
    forced_drains_.fetch_add(1);
    ctx_.fabric->Disconnect(*fx.disconnect);
  }
}

void Engine::AskVerdict(const JobPtr& job, absl::Time deadline) {
  absl::Status posted = PostPeerCall(job->target_node(), [this, job, deadline] {
    const absl::StatusOr<std::optional<absl::Status>> reply =
        peers_->QueryVerdict(job->target_node(), job->transfer()->id(), deadline);
    Run(job, [&](Job& j, JobEffects* fx)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { j.OnVerdictReply(reply, fx); });
  });
  if (!posted.ok()) {  // a question unasked: an error like any other, or shutting down
    Run(job, [&](Job& j, JobEffects* fx)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { j.OnVerdictReply(posted, fx); });
  }
}

void Engine::ProbeTarget(const JobPtr& job, absl::Time deadline) {
  absl::Status posted = PostPeerCall(job->target_node(), [this, job, deadline] {
    // Any answer at all says the agent is there; only its silence matters.
    const absl::Status reply =
        peers_->QueryVerdict(job->target_node(), job->transfer()->id(), deadline)
            .status();
    Run(job, [&](Job& j, JobEffects* fx)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { j.OnProbeReply(reply, fx); });
  });
  if (!posted.ok()) {  // not asked (its lane is full): go on as if it answered
    Run(job, [](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
      j.OnProbeReply(absl::OkStatus(), fx);
    });
  }
}

void Engine::ReleaseAfterFence(const relay::Slot& slot) {
  relay::Pool* const pool = gpu_relay_;
  auto release = [this, pool, slot] {
    // Its copy may still run: the slot is neither staged again nor freed under it.
    if (slot.ready != nullptr && !slot.ready->Wait().ok()) fence_errors_.fetch_add(1);
    pool->Release(slot);
  };
  if (relay_worker_.Post([this, release] {
        release();
        KickWaiting();  // a job may wait for this slot
      })) {
    return;
  }
  release();  // after Shutdown: only the fabric's last flush comes here
}

void Engine::GrowRelay(int nic) {
  if (gpu_relay_ == nullptr || growing_[nic].exchange(true)) return;
  const bool posted = relay_worker_.Post([this, nic] {
    const bool grown = gpu_relay_->Grow(nic);  // a VMM allocation: never on the data path
    growing_[nic].store(false);
    if (grown) KickWaiting();
  });
  if (!posted) growing_[nic].store(false);
}

void Engine::KickWaiting() {
  for (const JobPtr& job : waiting_.Kick()) {
    Run(job, [](Job& j, JobEffects* fx)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { j.Resume(fx); });
  }
}

void Engine::OnCompletion(const fabric::Completion& completion) {
  if (completion.wr_id != 0) {  // 0: a notice nobody follows
    const WrId w = DecodeWrId(completion.wr_id);
    bool known = false;
    if (JobPtr job = transfers_.FindLive(w.job); job != nullptr) {
      Run(job, [&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
        known = j.OnCompletion(w.entry, w.seq, completion, fx);
      });
    }
    if (!known) stray_completions_.fetch_add(1);
  }
  // Any completion frees a place in its NIC's queue, and maybe a NIC for a chunk.
  KickWaiting();
}

void Engine::OnVerdict(absl::string_view target_node, uint32_t imm) {
  const VerdictNotice notice = DecodeVerdict(imm);
  JobPtr job = transfers_.FindByVerdict(target_node, notice);
  if (job == nullptr) {
    stray_verdicts_.fetch_add(1);
    return;
  }
  Run(job, [&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
    j.OnVerdict(notice.verdict, fx);
  });
}

void Engine::OnIdleNics(fabric::PeerId peer, uint32_t idle_mask) {
  for (const JobPtr& job : transfers_.Live()) {
    absl::MutexLock lock(&job->mu());
    if (job->peer() == peer) job->SetRemoteIdle(idle_mask);
  }
  KickWaiting();  // NICs may have become idle
}

absl::StatusOr<std::shared_ptr<Transfer>> Engine::Find(
    absl::string_view transfer_id, absl::string_view request_id,
    absl::string_view requester) const {
  FL_ASSIGN_OR_RETURN(
      JobPtr job,
      transfers_.Find(transfer_id, request_id.empty() ? std::string()
                                                      : TransferRegistry::RequestKey(
                                                            requester, request_id)));
  if (job->requester() != requester) {
    // Another requester's: as if there were none, so that ids tell nothing.
    return WithReason(absl::NotFoundError(absl::StrCat(
                          "no transfer '", BoundedForMessage(transfer_id), "' of yours")),
                      reasons::kUnknownTransfer);
  }
  return job->transfer();
}

absl::Status Engine::OnJob(const std::shared_ptr<Transfer>& transfer, StatusEvent event) {
  absl::StatusOr<JobPtr> job = transfers_.Find(transfer->id(), "");
  if (!job.ok()) return job.status();
  absl::Status result;
  Run(*job, [&](Job& j, JobEffects* fx)
                ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { result = event(j, fx); });
  return result;
}

absl::Status Engine::Cancel(const std::shared_ptr<Transfer>& transfer) {
  return OnJob(
      transfer, [](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
        return j.Stop(WithReason(absl::CancelledError("cancelled by CancelTransfer"),
                                 reasons::kCancelled),
                      /*force=*/false, fx);
      });
}

absl::Status Engine::LayersReady(const std::shared_ptr<Transfer>& transfer,
                                 uint32_t end) {
  return OnJob(transfer, [end](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                             j.mu()) { return j.SetLayersReady(end, fx); });
}

absl::Status Engine::ExtendLease(const std::shared_ptr<Transfer>& transfer,
                                 uint32_t lease_ms) {
  FL_RETURN_IF_ERROR(CheckLeaseMs(lease_ms));
  return OnJob(transfer, [lease_ms](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                             j.mu()) { return j.ExtendLease(lease_ms, fx); });
}

void Engine::AbortTensor(uint64_t tensor_id, const absl::Status& why) {
  for (const JobPtr& job : transfers_.Live()) {
    Run(job, [&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
      // A committed transfer is the target's to end; it reads nothing more from the
      // tensor, so it need not stop.
      if (j.UsesTensor(tensor_id)) j.Stop(why, /*force=*/false, fx).IgnoreError();
    });
  }
}

void Engine::Shutdown() {
  if (!transfers_.Close()) return;  // admits nothing from here on
  auto stop_all = [this] {
    for (const JobPtr& job : transfers_.Live()) {
      Run(job, [](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
        j.Stop(ShuttingDownStatus(), /*force=*/true, fx).IgnoreError();  // ended: fine
      });
    }
  };
  stop_all();  // while the fabric still takes their aborts
  timers_.Stop();
  if (housekeeping_.joinable()) housekeeping_.join();
  // Calls under way return within their own bounds (PeerLink's call timeouts); the
  // jobs of queued ones are stopped already.
  preparers_.Stop(/*run_queued=*/false);
  in_node_preparers_.Stop(/*run_queued=*/false);
  stop_all();
  ctx_.posting_stopped.store(true);
  local_ctx_.posting_stopped.store(true);
  relay_worker_.Stop(/*run_queued=*/true);  // its fences and releases still run
}

void Engine::Tick(absl::Time now) {
  if (transfers_.active() > 0) last_active_ = now;
  if (now - last_active_ <= kLookAfterLast) scheduler_->Refresh();
  // Idle while demand, sampled: the state now stands for the time since the last
  // tick, at most a few looks' worth (a timer that slept saw nothing run).
  const absl::Duration since = std::min(now - last_tick_, 4 * kLookEvery);
  last_tick_ = now;
  scheduler_->SampleIdle(absl::ToInt64Nanoseconds(since), waiting_.size() > 0);
  for (const JobPtr& job : timers_.TakeDue(now)) {
    Run(job, [](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
      j.scheduled_timer = absl::InfiniteFuture();  // the queue let go of it
      j.OnTimer(fx);
    });
  }
  if (now >= next_collect_) {
    transfers_.Collect(now);
    next_collect_ = now + kCollectEvery;
  }
}

void Engine::HousekeepingLoop() {
  for (;;) {
    const absl::Time at = now();
    absl::Time until = next_collect_;
    if (at - last_active_ <= kLookAfterLast || transfers_.active() > 0) {
      until = std::min(until, at + kLookEvery);
    }
    if (!timers_.Wait(until)) return;
    Tick(now());
  }
}

void Engine::ReportStats(stats::Sink& sink) const {
  using stats::Kind;
  static constexpr stats::Family kActive{"fuselink_transfers_active",
                                         "Outgoing transfers preparing or running.",
                                         Kind::kGauge};
  static constexpr stats::Family kStrayCompletions{
      "fuselink_stray_completions_total",
      "Write completions that named no write in flight (repeated or forged by a "
      "transport); they changed nothing.",
      Kind::kCounter};
  static constexpr stats::Family kStrayVerdicts{
      "fuselink_stray_verdicts_total",
      "Verdict notices that named no live outgoing transfer (repeated, late or forged); "
      "they changed nothing.",
      Kind::kCounter};
  static constexpr stats::Family kFenceErrors{
      "fuselink_relay_fence_errors_total",
      "GPU relay copies whose fence failed while their slot waited to be released; the "
      "slot was released all the same.",
      Kind::kCounter};
  static constexpr stats::Family kForcedDrains{
      "fuselink_transfer_forced_drains_total",
      "Ended transfers whose writes were still in flight after "
      "--transfer_drain_timeout_ms, so that the connections to their target were "
      "closed to fail them.",
      Kind::kCounter};
  static constexpr stats::Family kPrepareQueueFull{
      "fuselink_prepare_queue_full_total",
      "Calls to a target refused because its lane was full (--prepare_queue_per_target): "
      "the transfer failed RESOURCE_EXHAUSTED (PREPARE_QUEUE_FULL), or a question about "
      "its verdict went unasked.",
      Kind::kCounter};
  sink.Add(kActive, static_cast<double>(active()));
  sink.Add(kStrayCompletions, static_cast<double>(stray_completions()));
  sink.Add(kStrayVerdicts, static_cast<double>(stray_verdicts()));
  sink.Add(kFenceErrors, static_cast<double>(fence_errors()));
  sink.Add(kForcedDrains, static_cast<double>(forced_drains()));
  sink.Add(kPrepareQueueFull, static_cast<double>(prepares_refused()));
  sink.Add(stats::kShareRefusals, {{"reason", "TRANSFER_SHARE"}},
           static_cast<double>(share_refusals()));
}

}  // namespace fuselink::transfer
