// How the engine runs a job's events (the class: engine.h): Run takes the job's
// lock for one event, then Apply does outside it what the job asked for (relay
// slots, the observer, watches, a question to the target, a forced drain); a job
// that must wait for room is listed, and kicked when some may be free. The
// fabric's events come in here: completions, verdict notices, idle-NIC masks.
#include "agent/transfer/engine.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/wr_id.h"

namespace fuselink::transfer {

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

}  // namespace fuselink::transfer
