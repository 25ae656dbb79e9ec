// The source engine's start (the class: engine.h): what it is built from (the
// jobs' contexts, the prepare lanes), how a transfer enters it (Submit: the checks,
// the source pinned, admission; then PrepareJob and Prepare on a prepare thread,
// once the target's session is up), and the housekeeping thread the constructor
// starts (Tick: due timers, the scheduler's look, forgetting finished transfers).
// How a job's events run is in engine_run.cc; the calls on a started transfer,
// shutdown and stats, in engine_control.cc.
#include "agent/transfer/engine.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_format.h"
#include "agent/common/check.h"
#include "agent/common/limits.h"
#include "agent/common/options.h"
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
  j.window_chunks = o.window_chunks;  // 1 to kMaxWindowChunks: the engine checked
  j.verdict = o.verdict;
  j.wait_backstop = o.wait_backstop;
  j.abort_patience = o.abort_patience;
  j.drain_bound = o.drain_bound;
  return j;
}

KeyedPoolOptions PrepareLanes(const EngineOptions& o) {
  KeyedPoolOptions lanes;
  lanes.name = "calls to target";
  lanes.thread_name = "fl-prepare";
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
  lane.thread_name = "fl-prepare-self";
  lane.reason = reasons::kPrepareQueueFull;
  lane.threads = kInNodePrepareThreads;
  lane.running_per_key = kInNodePrepareThreads;
  // Never reached: a job has at most one call queued and one running.
  lane.pending_per_key = lane.pending_total = 2 * o.max_active_transfers;
  return lane;
}

// The engine's own options, checked before any part is built from them.
EngineOptions Checked(EngineOptions o) {
  FL_CHECK_OK(o.Validate());
  return o;
}

}  // namespace

absl::Status EngineOptions::Validate() const {
  FL_RETURN_IF_ERROR(InRange("chunk_bytes", chunk_bytes, kMinChunkBytes, kMaxChunkBytes));
  FL_RETURN_IF_ERROR(InRange("window_chunks", window_chunks, 1u, kMaxWindowChunks));
  // The prepare lanes' queues are sized from it (PrepareLanes).
  FL_RETURN_IF_ERROR(AtLeast<size_t>("max_active_transfers", max_active_transfers, 1));
  FL_RETURN_IF_ERROR(AtLeast<size_t>("max_active_transfers_per_requester",
                                     max_active_transfers_per_requester, 1));
  FL_RETURN_IF_ERROR(InRange("prepare_threads", prepare_threads, 1, kMaxPoolThreads));
  FL_RETURN_IF_ERROR(InRange("prepare_threads_per_target", prepare_threads_per_target, 1,
                             prepare_threads));
  if (prepare_queue_per_target != 0) {
    FL_RETURN_IF_ERROR(AtLeast("prepare_queue_per_target", prepare_queue_per_target,
                               static_cast<size_t>(prepare_threads_per_target)));
  }
  return InRange("drain_bound", drain_bound, absl::Milliseconds(1),
                 absl::Milliseconds(kMaxTimeoutMs));
}

Engine::Engine(EngineOptions options, const topo::Topology& topology,
               memory::Registry* registry, fabric::Fabric* fabric, PeerLink* peers,
               sched::Scheduler* scheduler, relay::Pool* gpu_relay,
               EngineObserver* observer)
    : options_(Checked(std::move(options))),
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
      relay_worker_(1, "fl-relay") {
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
  NameThisThread("fl-engine-timer");
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

}  // namespace fuselink::transfer
