// The verbs fabric's writes (the class: verbs/fabric_impl.h): a write the NIC can read
// is posted at once; one from GPU memory it cannot read, or from a source still being
// written, waits in its peer's queue on the NIC's sender (verbs/staged_sender.h), whose
// thread waits for the fence, stages it in one of the peer's share of bounce slots and
// posts it, serving the other peers while one's write cannot go on.
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/checks.h"
#include "agent/fabric/verbs/fabric_impl.h"

namespace fuselink::fabric {
namespace verbs_internal {
namespace {

const std::vector<LinkPtr> kNoLinks;
// A deferred write that meets a spent quota is tried again after kQuotaRetry, for at
// most kQuotaWait; then it fails UNAVAILABLE (to go over another NIC).
constexpr absl::Duration kQuotaRetry = absl::Microseconds(50);
constexpr absl::Duration kQuotaWait = absl::Seconds(1);
// How often a write that claimed a slot looks again for one kept out of the pool.
constexpr absl::Duration kKeptSlotRetry = absl::Milliseconds(1);

}  // namespace

absl::Status VerbsFabric::PostWrite(PeerId peer, int nic, const WriteOp& op) {
  FL_RETURN_IF_ERROR(CheckWrite(nic, nic_count(), op, options_.max_write_bytes));
  std::shared_ptr<const VerbsRegion> region;
  if (op.bytes > 0) {
    absl::ReaderMutexLock lock(&regions_mu_);
    auto it = regions_.find(op.local_key);
    if (it == regions_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("local extent: no region ", op.local_key));
    }
    if (!ExtentFits(op.local_offset, op.bytes, it->second->bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "local extent: [", op.local_offset, ", +", op.bytes, ") outside region ",
          op.local_key, " of ", it->second->bytes, " bytes"));
    }
    region = it->second;
  }
  // GPU memory this NIC cannot read, or a source still being written (the relay's
  // copy into its slot): the NIC's sender thread waits, stages and posts.
  if (op.after != nullptr || (region != nullptr && !region->mrs[nic])) {
    return Defer(peer, nic, op, std::move(region));
  }
  return PostResolved(peer, nic, op, DirectSource(region, nic, op.local_offset));
}

verbs::WriteSource VerbsFabric::DirectSource(
    const std::shared_ptr<const VerbsRegion>& region, int nic, uint64_t offset) {
  if (region == nullptr) return {};  // a notification
  return {.address = reinterpret_cast<uint64_t>(region->base + offset),
          .lkey = region->mrs[nic]->lkey,
          .hold = region};
}

absl::Status VerbsFabric::PostResolved(PeerId peer, int nic, const WriteOp& op,
                                       verbs::WriteSource source) {
  // Held across the post: a QP is freed only after OnQpClosed, which takes mu_.
  absl::ReaderMutexLock lock(&mu_);
  const Peer* to = peers_.Get(peer);
  if (to == nullptr || to->retired) {
    return absl::UnavailableError(absl::StrCat("peer ", peer, " is not connected"));
  }
  for (const LinkPtr& link : to->links) {
    if (link->role() != ControlLink::Role::kOutbound || link->nic().index() != nic)
      continue;
    VerbsQp* qp = link->NextQp();
    if (qp == nullptr) continue;
    verbs::RemoteTarget target;
    if (op.bytes > 0) {
      std::optional<verbs::RemoteTarget> extent =
          link->Resolve(op.remote_key, op.remote_offset, op.bytes);
      // No registration of ours holds it: the target says why it refuses it.
      if (!extent.has_value()) return link->AskTarget(op);
      target = *extent;
    }
    return link->nic().Post(qp, op, std::move(source), target.address, target.rkey);
  }
  return absl::UnavailableError(
      absl::StrCat("peer '", to->name, "' is not connected on NIC ", nic));
}

absl::Status VerbsFabric::Defer(PeerId peer, int nic, const WriteOp& op,
                                std::shared_ptr<const VerbsRegion> region) {
  const bool staged = region != nullptr && !region->mrs[nic];
  if (staged && op.bytes > options_.staging_slot_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a staged write of ", op.bytes, " bytes: NIC ", nic,
                     " stages at most ", options_.staging_slot_bytes));
  }
  if (senders_.empty()) {  // fences and staging come only with a device stager
    return absl::UnimplementedError(
        "this verbs fabric has no GPU stager: it takes no fenced or GPU writes");
  }
  NicSender& sender = *senders_[nic];
  if (sender.queued.fetch_add(1) >= options_.queue_depth_per_nic) {
    sender.queued.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        "NIC ", nic, " has ", options_.queue_depth_per_nic, " staged writes queued"));
  }
  auto write = std::make_unique<Deferred>();
  write->fabric = this;
  write->peer = peer;
  write->nic = nic;
  write->op = op;
  write->region = std::move(region);
  {
    absl::MutexLock lock(&mu_);
    const Peer* to = shutting_down_ ? nullptr : peers_.Get(peer);
    LinkEntry* pinned = nullptr;
    for (const LinkPtr& link : to != nullptr && !to->retired ? to->links : kNoLinks) {
      if (link->role() != ControlLink::Role::kOutbound || link->nic().index() != nic)
        continue;
      // Only a link with QPs: one without is done, or queued for the reaper.
      auto entry = links_.find(link->id());
      if (entry != links_.end() && entry->second.live_qps > 0) {
        pinned = &entry->second;
        break;
      }
    }
    if (pinned == nullptr) {
      sender.queued.fetch_sub(1);
      return absl::UnavailableError(
          absl::StrCat("peer ", peer, " is not connected on NIC ", nic));
    }
    // The link holds the peer up until the write has been posted or failed.
    ++pinned->deferred;
    write->link = pinned->link->id();
  }
  sender.queues.Queue(peer, std::move(write));
  return absl::OkStatus();
}

verbs::StagedSender::Step VerbsFabric::TryDeferred(Deferred& write) {
  using Outcome = verbs::StagedSender::Outcome;
  absl::Status status = PassFence(write);
  if (status.ok() && !write.source.has_value()) {
    if (std::optional<verbs::StagedSender::Step> wait = ClaimSlot(write)) return *wait;
    absl::StatusOr<verbs::WriteSource> source = StageSource(write);
    status = source.status();
    if (source.ok()) write.source = *std::move(source);
  }
  if (status.ok()) {
    status = PostResolved(write.peer, write.nic, write.op, *write.source);
    // A quota spent by direct writes frees as their completions come: tried again
    // shortly, other peers' writes meanwhile.
    if (absl::IsResourceExhausted(status)) {
      const absl::Time now = absl::Now();
      if (write.quota_deadline == absl::InfiniteFuture())
        write.quota_deadline = now + kQuotaWait;
      if (now <= write.quota_deadline)
        return {.outcome = Outcome::kRetry, .retry_at = now + kQuotaRetry};
    }
  }
  EndDeferred(write, std::move(status));
  return {.outcome = Outcome::kDone};
}

std::optional<verbs::StagedSender::Step> VerbsFabric::ClaimSlot(Deferred& write) {
  using Outcome = verbs::StagedSender::Outcome;
  const bool staged = write.region != nullptr && !write.region->mrs[write.nic];
  if (!staged || write.claim != nullptr) return std::nullopt;
  NicSender& sender = *senders_[write.nic];
  // Its peer's share of the slots, or every slot, taken: tried again once one returns.
  write.claim = sender.queues.TryClaimSlot(write.peer);
  if (write.claim == nullptr)
    return verbs::StagedSender::Step{.outcome = Outcome::kNoSlot};
  // Claimed, yet none is free: a slot is kept out of the pool without a claim (a GPU
  // copy that timed out may still write it) until the housekeeping gives it back.
  // Looked at again shortly, so that BouncePool::Acquire never waits here.
  if (sender.pool != nullptr && sender.pool->free_slots() == 0) {
    write.claim.reset();
    return verbs::StagedSender::Step{.outcome = Outcome::kRetry,
                                     .retry_at = absl::Now() + kKeptSlotRetry};
  }
  return std::nullopt;
}

absl::Status VerbsFabric::PassFence(Deferred& write) {
  if (write.op.after == nullptr || write.fenced) return absl::OkStatus();
  write.fenced = true;
  absl::Status ready = write.op.after->Wait();
  if (ready.ok()) return ready;
  // As over TCP: the source is unreadable, the write fails over to another NIC.
  return absl::UnavailableError(
      absl::StrCat("the source of the write was not ready: ", ready.message()));
}

void VerbsFabric::EndDeferred(Deferred& write, absl::Status status) {
  if (!status.ok()) {
    // Whatever kept it from the wire, the write may go over another NIC.
    if (!absl::IsUnavailable(status)) {
      status = absl::UnavailableError(
          absl::StrCat("the deferred write was not sent: ", status.ToString()));
    }
    handler_.OnCompletion(Completion{.wr_id = write.op.wr_id,
                                     .nic = write.nic,
                                     .bytes = write.op.bytes,
                                     .status = std::move(status)});
  }
  // A slot not posted from goes back now (a posted one when its write completes).
  write.source.reset();
  write.claim.reset();
  FinishDeferred(write);
}

absl::StatusOr<verbs::WriteSource> VerbsFabric::StageSource(Deferred& write) {
  const VerbsRegion* region = write.region.get();
  if (region == nullptr || region->mrs[write.nic]) {
    return DirectSource(write.region, write.nic, write.op.local_offset);
  }
  NicSender& sender = *senders_[write.nic];
  DeviceStager& stager = *options_.device_stager;  // a region without MRs has one
  // Made on the first staged write; a failure is kept, not retried for every write.
  FL_RETURN_IF_ERROR(sender.unusable);
  if (sender.pool == nullptr) {
    absl::StatusOr<std::shared_ptr<verbs::BouncePool>> pool = verbs::BouncePool::Create(
        stager, write.nic, options_.staging_slots_per_nic, options_.staging_slot_bytes,
        verbs::BouncePool::LocalReads(nics_[write.nic]->pd()));
    absl::StatusOr<std::unique_ptr<DeviceStage>> stage = stager.NewStage(write.nic);
    sender.unusable.Update(pool.status());
    sender.unusable.Update(stage.status());
    if (!sender.unusable.ok()) {
      sender.unusable = WithContext(
          sender.unusable, absl::StrCat("NIC ", write.nic, " cannot stage GPU memory"));
      return sender.unusable;
    }
    sender.pool = *std::move(pool);
    sender.stage = *std::move(stage);
  }
  // ClaimSlot saw a free slot, and only this thread takes them: no wait here.
  FL_DCHECK(sender.pool->free_slots() > 0, "a claimed bounce slot is not free");
  if (sender.stage == nullptr) {  // the last one was spent by a copy past its bound
    FL_ASSIGN_OR_RETURN(sender.stage, stager.NewStage(write.nic));
  }
  absl::StatusOr<std::shared_ptr<const verbs::BouncePool::Slot>> staged = verbs::StageOut(
      *sender.pool, *sender.stage, region->gpu,
      reinterpret_cast<uint64_t>(region->base) + write.op.local_offset, write.op.bytes);
  if (ReasonOf(staged.status()) == reasons::kGpuCopyTimeout.name) {
    sender.stage.reset();  // it keeps what its copy may touch until the copy ends
  }
  FL_ASSIGN_OR_RETURN(std::shared_ptr<const verbs::BouncePool::Slot> slot,
                      std::move(staged));
  // The slot and its claim go together. Members die bottom-up: the slot returns to
  // the pool before its claim, so a claim never goes back while its slot is in use.
  struct Held {
    std::shared_ptr<const void> claim;
    std::shared_ptr<const verbs::BouncePool::Slot> slot;
  };
  auto held = std::make_shared<Held>(Held{.claim = std::move(write.claim), .slot = slot});
  return verbs::WriteSource{.address = reinterpret_cast<uint64_t>(slot->data),
                            .lkey = slot->lkey,
                            .hold = std::shared_ptr<const void>(held, slot.get())};
}

void VerbsFabric::FinishDeferred(const Deferred& write) {
  // Called only for writes Defer took, which exist only with senders.
  senders_[write.nic]->queued.fetch_sub(1);
  PeerId peer_id = 0;
  std::optional<std::string> lost;
  absl::Status why;
  {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(write.link);
    if (it == links_.end()) return;
    LinkEntry& entry = it->second;
    --entry.deferred;
    if (entry.alive()) return;
    peer_id = entry.peer;
    why = entry.link->close_reason();
    lost = LoseIfDone(peer_id);
    MaybeReap(write.link, entry);
  }
  if (lost.has_value()) handler_.OnPeerLost(peer_id, *lost, PeerLostStatus(why));
}

}  // namespace verbs_internal
}  // namespace fuselink::fabric
