#include "agent/transfer/engine.h"

#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/plan.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace fuselink::transfer {

// One bound on NICs for the topology, the scheduler's table and the credit masks.
static_assert(sched::kMaxNics == topo::kMaxNics);
static_assert(kIdleMaskBits >= topo::kMaxNics);

// The data-plane side of one transfer. Guarded by transfer->mu() once the prepare
// thread has filled it in.
struct Engine::Job {
  std::shared_ptr<Transfer> transfer;
  memory::TensorLease source;
  Prepared target;
  std::vector<Extent> extents;
  std::optional<ChunkCursor> cursor;
  std::vector<Chunk> pending;  // refused by a full queue, or failed: posted first
  uint32_t usable = 0;         // NICs that still reach the target, bit k: NIC k
  InFlight commit;             // the notice that ends the transfer at the target
  bool commit_acked = false;
  int direct_nic = 0;
  uint32_t remote_idle = 0;  // the receiver's idle NICs, from its credits
  bool waiting = false;      // listed in waiting_: no NIC could take its chunk
  std::weak_ptr<Job> self;
  std::vector<InFlight> window;
  std::vector<uint32_t> free_slots;
  uint32_t in_flight = 0;
  bool accepted = false;
  // MaybeFinishLocked ended the job; written under the transfer's lock, read without
  // it by the engine's loops that skip finished jobs.
  std::atomic<bool> finished_flag{false};
};

namespace {

std::vector<std::string> NicNames(const topo::Topology& topology) {
  std::vector<std::string> names;
  for (const auto& nic : topology.nics()) names.push_back(nic.name());
  return names;
}

// The request's content without its deadline, for idempotency: a retry may carry a
// new deadline and still be the same request.
std::string Fingerprint(const v1::TransferRequest& request) {
  v1::TransferRequest copy = request;
  copy.clear_deadline();
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  copy.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

std::span<const uint32_t> Ids(const google::protobuf::RepeatedField<uint32_t>& ids) {
  return {ids.data(), static_cast<size_t>(ids.size())};
}

absl::Time RequestDeadline(const v1::TransferRequest& request) {
  if (!request.has_deadline()) return absl::InfiniteFuture();
  return absl::FromUnixSeconds(request.deadline().seconds()) +
         absl::Nanoseconds(request.deadline().nanos());
}

}  // namespace

Engine::Engine(EngineOptions options, const topo::Topology& topology,
               memory::Registry* registry, fabric::Fabric* fabric, PeerLink* peers,
               sched::Scheduler* scheduler, relay::Pool* relay, relay::Pool* gpu_relay,
               EngineObserver* observer)
    : options_(std::move(options)),
      topology_(topology),
      registry_(registry),
      fabric_(fabric),
      peers_(peers),
      scheduler_(scheduler),
      relay_(relay),
      gpu_relay_(gpu_relay),
      observer_(observer),
      nic_names_(NicNames(topology)),
      id_prefix_(absl::StrFormat("%s-%08x-", options_.node,
                                 static_cast<uint32_t>(std::random_device{}()))) {
  for (int i = 0; i < options_.prepare_threads; ++i) {
    threads_.emplace_back([this] { PrepareLoop(); });
  }
  threads_.emplace_back([this] { HousekeepingLoop(); });
}

Engine::~Engine() {
  Shutdown();
  for (std::thread& t : threads_) t.join();
}

void Engine::Shutdown() {
  std::vector<JobPtr> jobs;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    jobs = LiveJobsLocked();
  }
  for (const JobPtr& job : jobs) {
    bool done;
    {
      absl::MutexLock lock(&job->transfer->mu());
      StopLocked(*job, WithReason(absl::UnavailableError("the agent is shutting down"),
                                  "SHUTTING_DOWN"));
      done = MaybeFinishLocked(*job);
    }
    if (done) Finished(*job);
  }
}

size_t Engine::active() const {
  absl::MutexLock lock(&mu_);
  return active_;
}

absl::StatusOr<std::shared_ptr<Transfer>> Engine::Submit(
    const v1::TransferRequest& request, absl::Time call_deadline) {
  FL_ASSIGN_OR_RETURN(JobPtr job, Admit(request, call_deadline));
  return job->transfer;
}

absl::StatusOr<Engine::JobPtr> Engine::Admit(const v1::TransferRequest& request,
                                             absl::Time call_deadline) {
  const std::string& rid = request.request_id();
  if (rid.empty() || rid.size() > 128) {
    return WithReason(absl::InvalidArgumentError("request_id must be 1 to 128 bytes"),
                      "BAD_REQUEST_ID");
  }
  std::string fingerprint = Fingerprint(request);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = by_request_.find(rid); it != by_request_.end()) {
      if (it->second->transfer->fingerprint() == fingerprint) return it->second;
      return WithReason(absl::AlreadyExistsError(absl::StrCat(
                            "request_id '", rid,
                            "' was already used for a transfer with other content")),
                        "REQUEST_ID_REUSED");
    }
  }
  const v1::BlockSet& src = request.source();
  const v1::BlockSet& dst = request.target();
  if (src.node() != options_.node) {
    if (src.node().empty() || !peers_->Knows(src.node())) {
      return WithReason(
          absl::NotFoundError(absl::StrCat("unknown source node '", src.node(), "'")),
          "UNKNOWN_NODE");
    }
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat(
            "source node is '", src.node(), "'; send the request to that node's agent")),
        "SOURCE_NOT_LOCAL");
  }
  if (dst.node() == options_.node) {
    return WithReason(absl::UnimplementedError("source and target are the same node"),
                      "LOCAL_TARGET");
  }
  if (!peers_->Knows(dst.node())) {
    return WithReason(
        absl::NotFoundError(absl::StrCat("unknown target node '", dst.node(), "'")),
        "UNKNOWN_NODE");
  }
  if (src.block_ids_size() != dst.block_ids_size()) {
    return WithReason(absl::InvalidArgumentError(
                          absl::StrCat("source lists ", src.block_ids_size(),
                                       " blocks, target ", dst.block_ids_size())),
                      "BLOCK_COUNT_MISMATCH");
  }
  FL_ASSIGN_OR_RETURN(memory::TensorLease lease, registry_->Acquire(src.tensor()));
  const memory::Layout& layout = lease.info().layout;
  FL_RETURN_IF_ERROR(ValidateBlocks(layout, Ids(src.block_ids()), "source", false));
  uint32_t layer_begin = 0, layer_end = layout.layers;
  if (request.has_layers()) {
    layer_begin = request.layers().begin();
    layer_end = request.layers().end();
  }
  FL_RETURN_IF_ERROR(ValidateLayers(layout, layer_begin, layer_end));

  auto job = std::make_shared<Job>();
  job->self = job;
  job->source = std::move(lease);
  job->direct_nic = topo::DirectNic(topology_, job->source.info().home_gpu);
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    return WithReason(absl::UnavailableError("the agent is shutting down"),
                      "SHUTTING_DOWN");
  }
  if (auto it = by_request_.find(rid); it != by_request_.end()) {  // raced a twin
    if (it->second->transfer->fingerprint() == fingerprint) return it->second;
    return WithReason(absl::AlreadyExistsError("request_id reused"), "REQUEST_ID_REUSED");
  }
  if (active_ >= options_.max_active_transfers) {
    return WithReason(absl::ResourceExhaustedError(
                          absl::StrCat(options_.max_active_transfers,
                                       " transfers are already in flight; retry later")),
                      "TOO_MANY_TRANSFERS");
  }
  ++active_;
  job->transfer = std::make_shared<Transfer>(
      absl::StrCat(id_prefix_, next_id_++), request, std::move(fingerprint), nic_names_,
      std::min(RequestDeadline(request), call_deadline));
  by_id_.emplace(job->transfer->id(), job);
  by_request_.emplace(rid, job);
  to_prepare_.push_back(job);
  return job;
}

void Engine::PrepareLoop() {
  for (;;) {
    JobPtr job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Engine* e) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return e->stopping_ || !e->to_prepare_.empty();
          },
          this));
      if (stopping_) return;
      job = std::move(to_prepare_.front());
      to_prepare_.pop_front();
    }
    Prepare(job);
  }
}

void Engine::Prepare(const JobPtr& job) {
  Transfer& t = *job->transfer;
  const v1::TransferRequest& req = t.request();
  const memory::Layout& layout = job->source.info().layout;
  IncomingSpec spec;
  spec.target_node = req.target().node();
  spec.transfer_id = t.id();
  spec.tensor = req.target().tensor();
  spec.block_ids.assign(req.target().block_ids().begin(), req.target().block_ids().end());
  spec.layer_begin = req.has_layers() ? req.layers().begin() : 0;
  spec.layer_end = req.has_layers() ? req.layers().end() : layout.layers;
  spec.block_bytes = layout.block_bytes;
  spec.total_bytes =
      layout.block_bytes * spec.block_ids.size() * (spec.layer_end - spec.layer_begin);
  spec.deadline = t.deadline();
  spec.source_nic = job->direct_nic;

  absl::StatusOr<Prepared> prepared = peers_->PrepareIncoming(spec);
  bool done = false;
  {
    absl::MutexLock lock(&t.mu());
    if (t.state_locked() != State::kPreparing) {
      // Cancelled or shut down meanwhile. A slot the target reserved expires there.
      done = MaybeFinishLocked(*job);
    } else if (!prepared.ok()) {
      t.SetState(State::kFailed, prepared.status());
      done = MaybeFinishLocked(*job);
    } else {
      job->target = *prepared;
      job->extents =
          PlanExtents(layout, prepared->layout, Ids(req.source().block_ids()),
                      Ids(req.target().block_ids()), spec.layer_begin, spec.layer_end);
      job->cursor.emplace(job->extents, options_.chunk_bytes);
      job->window.resize(options_.window_chunks);
      for (uint32_t i = 0; i < options_.window_chunks; ++i) {
        job->free_slots.push_back(options_.window_chunks - 1 - i);
        job->window[i].job = job.get();
      }
      job->pending.reserve(options_.window_chunks + 1);  // never grows past it
      job->usable = (1u << fabric_->nic_count()) - 1;
      job->commit.job = job.get();
      job->remote_idle = prepared->idle_nic_mask;
      job->accepted = true;  // and the scheduler is told its owner is busy
      scheduler_->OwnerStarted(job->direct_nic);
    }
  }
  if (done) return Finished(*job);
  if (!prepared.ok()) return;
  t.Accept(spec.total_bytes, CountChunks(job->extents, options_.chunk_bytes),
           spec.layer_begin, spec.layer_end - spec.layer_begin, fabric_->transport(),
           sched::PolicyName(scheduler_->policy()));
  {
    absl::MutexLock lock(&t.mu());
    PumpLocked(*job);
    done = MaybeFinishLocked(*job);
  }
  if (done) Finished(*job);
}

void Engine::PumpLocked(Job& job) {
  Transfer& t = *job.transfer;
  while (t.state_locked() == State::kRunning && !job.free_slots.empty()) {
    Chunk chunk;
    if (!job.pending.empty()) {
      chunk = job.pending.back();
      job.pending.pop_back();
    } else if (!job.cursor->Next(&chunk)) {
      return;
    }
    // GPU tensors relay through slots on GPUs; a relay GPU short of memory lends none.
    // Without a GPU relay (a NIC's GPU is no CUDA device here) a GPU chunk leaves a
    // borrowed NIC straight from the tensor, through its own GPU's PCIe link.
    relay::Pool* const pool = job.source.gpu() >= 0 ? gpu_relay_ : relay_;
    const uint32_t usable =
        job.usable &
        (pool == nullptr ? ~0u : pool->borrowable() | (1u << job.direct_nic));
    const sched::Choice choice =
        scheduler_->Pick(job.direct_nic, job.remote_idle, usable);
    if (!choice.ok()) {
      job.pending.push_back(chunk);
      return Wait(job);
    }
    const uint32_t index = job.free_slots.back();
    InFlight& f = job.window[index];
    f.chunk = chunk;
    f.choice = choice;
    f.relay = relay::Slot{};
    f.pool = pool;
    fabric::WriteOp op;
    op.local_key = job.source.region_key();
    op.local_offset = chunk.source_offset;
    if (choice.borrowed && pool != nullptr) {
      // The relay stage: into a slot of the borrowed NIC's GPU, sent from there.
      f.relay = pool->Acquire(choice.nic);
      if (!f.relay.valid()) {
        scheduler_->Complete(choice, 0);
        job.pending.push_back(chunk);
        return Wait(job);
      }
      absl::Status staged = pool->Stage(
          f.relay,
          relay::Source{job.source.base() + chunk.source_offset, job.source.gpu()},
          chunk.bytes);
      if (!staged.ok()) {
        scheduler_->Complete(choice, 0);
        ReleaseRelay(f, /*sent=*/false);
        job.pending.push_back(chunk);
        return StopLocked(job, WithReason(absl::InternalError(absl::StrCat(
                                              "relay stage: ", staged.message())),
                                          "RELAY_FAILED"));
      }
      op.local_key = f.relay.key;
      op.local_offset = f.relay.offset;
      op.after = f.relay.ready;
    }
    op.remote_key = job.target.window;
    op.remote_offset = chunk.target_offset;
    op.bytes = chunk.bytes;
    op.imm = EncodeImm(SlotId::Unpack(job.target.slot), ImmOp::kData);
    op.wr_id = reinterpret_cast<uint64_t>(&f);
    absl::Status posted = fabric_->PostWrite(job.target.peer, choice.nic, op);
    if (!posted.ok()) {
      scheduler_->Complete(choice, 0, !absl::IsResourceExhausted(posted));
      if (f.relay.valid()) ReleaseRelay(f, /*sent=*/false);
      job.pending.push_back(chunk);
      if (absl::IsResourceExhausted(posted)) return Wait(job);
      if (!NicFailedLocked(job, choice.nic, posted)) return;
      continue;
    }
    job.free_slots.pop_back();
    ++job.in_flight;
  }
}

bool Engine::NicFailedLocked(Job& job, int nic, const absl::Status& why) {
  job.usable &= ~(1u << nic);
  if (job.usable != 0) return true;  // its chunks go to the other NICs
  StopLocked(job, WithReason(absl::UnavailableError(absl::StrCat(
                                 "every NIC to ", job.transfer->request().target().node(),
                                 " failed; last: ", why.message())),
                             "PEER_LOST"));
  return false;
}

bool Engine::PostNoticeLocked(Job& job, ImmOp op, InFlight* tracked) {
  fabric::WriteOp notice;
  notice.imm = EncodeImm(SlotId::Unpack(job.target.slot), op);
  notice.wr_id = reinterpret_cast<uint64_t>(tracked);
  for (int i = 0; i < fabric_->nic_count(); ++i) {
    const int nic = (job.direct_nic + i) % fabric_->nic_count();
    if (!(job.usable >> nic & 1)) continue;
    absl::Status posted = fabric_->PostWrite(job.target.peer, nic, notice);
    if (posted.ok()) {
      if (tracked != nullptr) tracked->choice.nic = nic;
      return true;
    }
    if (!absl::IsUnavailable(posted) || !NicFailedLocked(job, nic, posted)) return false;
  }
  return false;
}

void Engine::Wait(Job& job) {
  if (job.waiting) return;
  job.waiting = true;
  waiting_count_.fetch_add(1, std::memory_order_acq_rel);
  absl::MutexLock lock(&waiting_mu_);
  waiting_.push_back(job.self.lock());
}

void Engine::KickWaiting() {
  if (waiting_count_.load(std::memory_order_acquire) == 0) return;
  std::vector<JobPtr> jobs;
  {
    absl::MutexLock lock(&waiting_mu_);
    jobs.swap(waiting_);
  }
  for (const JobPtr& job : jobs) {
    bool done;
    {
      absl::MutexLock lock(&job->transfer->mu());
      job->waiting = false;
      waiting_count_.fetch_sub(1, std::memory_order_acq_rel);
      PumpLocked(*job);
      done = MaybeFinishLocked(*job);
    }
    if (done) Finished(*job);
  }
}

void Engine::ReleaseRelay(InFlight& f, bool sent) {
  // A write that failed may have failed before the fabric waited on the slot's fence:
  // its copy may still run, and the slot must not be staged again or freed under it.
  if (!sent && f.relay.ready != nullptr) f.relay.ready->Wait().IgnoreError();
  f.pool->Release(f.relay);
}

std::vector<Engine::JobPtr> Engine::LiveJobsLocked() const {
  std::vector<JobPtr> jobs;
  jobs.reserve(active_);
  for (const auto& [id, job] : by_id_) {
    if (!job->finished_flag.load(std::memory_order_acquire)) jobs.push_back(job);
  }
  return jobs;
}

void Engine::OnVerdict(absl::string_view, uint32_t) {}

void Engine::OnIdleNics(fabric::PeerId peer, uint32_t idle_mask) {
  std::vector<JobPtr> jobs;
  {
    absl::MutexLock lock(&mu_);
    jobs = LiveJobsLocked();
  }
  for (const JobPtr& job : jobs) {
    absl::MutexLock lock(&job->transfer->mu());
    if (job->accepted && job->target.peer == peer) job->remote_idle = idle_mask;
  }
  KickWaiting();  // NICs may have become idle
}

void Engine::StopLocked(Job& job, absl::Status why) {
  Transfer& t = *job.transfer;
  const State s = t.state_locked();
  if (s == State::kPreparing || s == State::kRunning) t.SetState(State::kStopping, why);
}

bool Engine::MaybeFinishLocked(Job& job) {
  Transfer& t = *job.transfer;
  if (job.finished_flag.load(std::memory_order_relaxed) || job.in_flight > 0)
    return false;
  if (t.state_locked() == State::kRunning && t.all_done_locked() && job.accepted &&
      !job.commit_acked) {
    // Every byte is placed: tell the target, which then tells its watchers. The
    // transfer completes when the target has the notice.
    if (PostNoticeLocked(job, ImmOp::kCommit, &job.commit)) {
      ++job.in_flight;
      return false;
    }
    StopLocked(job, WithReason(absl::UnavailableError("cannot reach the target to "
                                                      "commit the transfer"),
                               "PEER_LOST"));
  }
  State s = t.state_locked();
  if (s == State::kRunning && job.commit_acked) {
    t.SetState(State::kCompleted, absl::OkStatus());
  } else if (s == State::kStopping) {
    const bool cancelled = absl::IsCancelled(t.failure_locked());
    t.SetState(cancelled ? State::kCancelled : State::kFailed, absl::OkStatus());
    if (job.accepted && ReasonOf(t.failure_locked()) != "PEER_LOST") {
      // Tell the target to drop its slot; best effort, the target also expires it.
      PostNoticeLocked(job, ImmOp::kAbort, nullptr);
    }
  } else if (!IsTerminal(s)) {
    return false;
  }
  job.finished_flag.store(true, std::memory_order_release);
  job.source = memory::TensorLease();  // the source tensor may be unregistered now
  if (job.accepted) scheduler_->OwnerStopped(job.direct_nic);
  return true;
}

void Engine::Finished(Job& job) {
  Transfer& t = *job.transfer;
  State state;
  absl::Duration elapsed;
  uint64_t bytes;
  {
    absl::MutexLock lock(&t.mu());
    state = t.state_locked();
    elapsed = t.elapsed_locked();
    bytes = t.total_bytes_locked();
  }
  {
    absl::MutexLock lock(&mu_);
    --active_;
    // A request that never got accepted may be retried under the same id.
    if (!job.accepted) {
      auto it = by_request_.find(t.request_id());
      if (it != by_request_.end() && it->second.get() == &job) by_request_.erase(it);
    }
  }
  if (observer_ != nullptr) observer_->OnTransferFinished(state, elapsed, bytes);
  t.Notify(false, absl::ZeroDuration());
}

void Engine::OnCompletion(const fabric::Completion& completion) {
  if (completion.wr_id == 0) return;  // an abort notice
  InFlight& f = *reinterpret_cast<InFlight*>(completion.wr_id);
  Job& job = *f.job;
  Transfer& t = *job.transfer;
  bool done;
  bool layer_or_state_change;
  int64_t give_back_ns = 0;
  {
    absl::MutexLock lock(&t.mu());
    --job.in_flight;
    const State before = t.state_locked();
    if (&f == &job.commit) {
      job.commit_acked = completion.status.ok();
      if (!completion.status.ok() && before == State::kRunning) {
        NicFailedLocked(job, f.choice.nic, completion.status);  // commit again elsewhere
      }
    } else {
      job.free_slots.push_back(static_cast<uint32_t>(&f - job.window.data()));
      if (f.relay.valid()) ReleaseRelay(f, completion.status.ok());
      give_back_ns = scheduler_->Complete(
          f.choice, completion.status.ok() ? f.chunk.bytes : 0, !completion.status.ok());
      if (completion.status.ok()) {
        t.AddDone(f.choice.nic, f.chunk.layer, f.chunk.bytes);
      } else if (before == State::kRunning) {
        // The NIC failed this peer: the chunk goes again on another. A write whose
        // bytes did land is simply written twice; the target counts it as placed.
        job.pending.push_back(f.chunk);
        NicFailedLocked(job, f.choice.nic, completion.status);
      }
    }
    PumpLocked(job);
    done = MaybeFinishLocked(job);
    layer_or_state_change = before != t.state_locked();
  }
  if (give_back_ns > 0 && observer_ != nullptr) {
    observer_->OnGiveBack(f.choice.nic, absl::Nanoseconds(give_back_ns));
  }
  if (done) {
    Finished(job);
  } else {
    t.Notify(!layer_or_state_change, options_.progress_interval);
  }
  KickWaiting();
}

absl::StatusOr<std::shared_ptr<Transfer>> Engine::Find(
    absl::string_view transfer_id, absl::string_view request_id) const {
  absl::MutexLock lock(&mu_);
  if (!transfer_id.empty()) {
    if (auto it = by_id_.find(transfer_id); it != by_id_.end()) {
      return it->second->transfer;
    }
  } else if (!request_id.empty()) {
    if (auto it = by_request_.find(request_id); it != by_request_.end()) {
      return it->second->transfer;
    }
  }
  return WithReason(absl::NotFoundError(absl::StrCat("no transfer '", transfer_id,
                                                     request_id, "' on this node")),
                    "UNKNOWN_TRANSFER");
}

absl::Status Engine::Cancel(const std::shared_ptr<Transfer>& transfer) {
  JobPtr job;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_id_.find(transfer->id());
    if (it == by_id_.end()) return absl::NotFoundError("transfer is gone");
    job = it->second;
  }
  return StopJob(
      job, WithReason(absl::CancelledError("cancelled by CancelTransfer"), "CANCELLED"));
}

absl::Status Engine::StopJob(const JobPtr& job, absl::Status why) {
  Transfer& transfer = *job->transfer;
  bool done;
  {
    absl::MutexLock lock(&transfer.mu());
    const State s = transfer.state_locked();
    if (s != State::kPreparing && s != State::kRunning) {
      return WithReason(absl::FailedPreconditionError(
                            "the transfer has already finished or is stopping"),
                        "TRANSFER_FINISHED");
    }
    StopLocked(*job, std::move(why));
    // A preparing job finishes when its prepare call returns.
    done = job->accepted && MaybeFinishLocked(*job);
  }
  if (done) Finished(*job);
  transfer.Notify(false, absl::ZeroDuration());
  return absl::OkStatus();
}

void Engine::AbortTensor(uint64_t tensor_id, const absl::Status& why) {
  std::vector<JobPtr> jobs;
  {
    absl::MutexLock lock(&mu_);
    jobs = LiveJobsLocked();
  }
  for (const JobPtr& job : jobs) {
    bool uses;
    {
      absl::MutexLock lock(&job->transfer->mu());
      uses = job->source.valid() && job->source.id() == tensor_id;
    }
    if (uses) StopJob(job, why).IgnoreError();
  }
}

void Engine::HousekeepingLoop() {
  constexpr absl::Duration kTick = absl::Milliseconds(5);
  absl::Time next_gc = absl::Now();
  for (;;) {
    std::vector<JobPtr> jobs;
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), kTick)) return;
      jobs = LiveJobsLocked();
    }
    const absl::Time now = absl::Now();
    scheduler_->Refresh();
    for (const JobPtr& job : jobs) {
      Transfer& t = *job->transfer;
      bool done = false;
      {
        absl::MutexLock lock(&t.mu());
        if (IsTerminal(t.state_locked())) continue;
        if (now > t.deadline()) {
          StopLocked(
              *job,
              WithReason(absl::DeadlineExceededError("the transfer's deadline passed"),
                         "DEADLINE"));
        }
        if (job->accepted) {
          if (!job->pending.empty() && !job->waiting) PumpLocked(*job);
          done = MaybeFinishLocked(*job);
        }
      }
      if (done) Finished(*job);
    }
    if (now < next_gc) continue;
    next_gc = now + absl::Seconds(1);
    // Forget finished transfers past their keeping time, oldest first past the cap.
    // Finish times are read off the engine's lock (lock order: transfer, then engine).
    jobs.clear();
    {
      absl::MutexLock lock(&mu_);
      for (auto& [id, job] : by_id_) {
        if (job->finished_flag.load(std::memory_order_acquire)) jobs.push_back(job);
      }
    }
    std::vector<std::pair<absl::Time, std::string>> finished;
    for (const JobPtr& job : jobs) {
      const absl::Time at = job->transfer->finished_at();
      if (at != absl::InfiniteFuture()) finished.emplace_back(at, job->transfer->id());
    }
    std::sort(finished.begin(), finished.end());
    size_t excess = finished.size() > options_.max_finished_kept
                        ? finished.size() - options_.max_finished_kept
                        : 0;
    absl::MutexLock lock(&mu_);
    for (auto& [at, id] : finished) {
      if (excess == 0 && now - at < options_.finished_kept_for) break;
      if (excess > 0) --excess;
      auto it = by_id_.find(id);
      if (it == by_id_.end()) continue;
      auto rit = by_request_.find(it->second->transfer->request_id());
      if (rit != by_request_.end() && rit->second == it->second) by_request_.erase(rit);
      by_id_.erase(it);
    }
  }
}

}  // namespace fuselink::transfer
