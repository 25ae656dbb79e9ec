// The calls on a transfer that has started (the class: engine.h): Find, then
// Cancel, LayersReady and ExtendLease, each one event on its job (OnJob);
// AbortTensor when a source tensor goes; Shutdown, which stops every job and joins
// the engine's threads; and the engine's stats.
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/admission.h"
#include "agent/transfer/engine.h"

namespace fuselink::transfer {

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
