// A QP's renewal after the target's NIC refused one of its writes (verbs/nic.h,
// "Refusals"): the poller holds the writes flushed behind the refused one and asks for
// the renewal once every WR of the QP is back (ReadyToRenew); the worker restarts the
// QP (RestartQp), the link's thread connects it to the target's new QP and posts the
// held writes again (ResumeQp); the poller closes a renewal that takes too long
// (ExpireRenewals). The same sweep bounds an active QP's writes: none acknowledged
// within ack_timeout closes it (ExpireStalledWrites). A step that uses the ibv_qp outside
// the QP's lock marks it busy: a close meanwhile is deferred to the step's end, and the
// poller does not destroy it.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/verbs/nic.h"

namespace fuselink::fabric::verbs {

bool Nic::ReadyToRenew(VerbsQp& qp) {
  if (qp.state != VerbsQp::State::kRenewing || qp.renew_requested) return false;
  if (qp.tail - qp.head != qp.held || qp.posted_recvs != 0) return false;
  qp.renew_requested = true;
  return true;
}

absl::StatusOr<uint32_t> Nic::RestartQp(VerbsQp& qp) {
  {
    absl::MutexLock lock(&qp.mu);
    if (qp.state != VerbsQp::State::kRenewing || qp.finalized) {
      return absl::FailedPreconditionError("the QP closed before its renewal");
    }
    qp.busy = true;
  }
  absl::Status reset = qp.qp.ToInitAgain(rc_);
  uint32_t psn = 0;
  {
    absl::MutexLock lock(&qp.mu);
    if (EndBusy(qp)) return qp.close_reason;  // closed meanwhile
    if (reset.ok()) reset = PostRecvs(qp);
    qp.local_psn = RandomPsn();
    psn = qp.local_psn;
  }
  if (!reset.ok()) {
    CloseQp(&qp, reset);
    return reset;
  }
  return psn;
}

absl::Status Nic::ResumeQp(VerbsQp& qp, uint32_t remote_qpn, uint32_t remote_psn) {
  RemoteQp remote;
  {
    absl::MutexLock lock(&qp.mu);
    if (qp.state != VerbsQp::State::kRenewing || qp.finalized) {
      return absl::FailedPreconditionError("the QP closed before its renewal");
    }
    qp.busy = true;
    remote = qp.remote;
  }
  remote.qpn = remote_qpn;
  remote.psn = remote_psn & 0xFFFFFF;
  absl::Status connected = ConnectQp(&qp, remote);
  std::vector<Completion> refused;
  std::vector<std::shared_ptr<const void>> released;
  {
    absl::MutexLock lock(&qp.mu);
    if (EndBusy(qp)) return qp.close_reason;
    if (connected.ok()) {
      // Nothing of the QP is on the wire, so the ring may be rearranged: writes into
      // the window the target refused would only be refused again (its registrations
      // went together), so they complete now; the rest close up behind `head`, in
      // their order.
      const size_t size = qp.ring.size();
      uint64_t kept = qp.head;
      for (uint64_t position = qp.head; position != qp.tail; ++position) {
        VerbsQp::SendSlot& slot = qp.ring[position % size];
        if (slot.bytes > 0 && slot.descriptor.key == qp.refused_window) {
          refused.push_back({.wr_id = slot.user_wr_id,
                             .nic = index_,
                             .bytes = slot.bytes,
                             .status = RefusalStatus(Refusal::kNoWindow),
                             .refusal = Refusal::kNoWindow});
          released.push_back(std::move(slot.hold));
          send_quota_used_.fetch_sub(1, std::memory_order_acq_rel);
          refused_.fetch_add(1, std::memory_order_relaxed);
          --qp.held;
          continue;
        }
        if (kept != position) qp.ring[kept % size] = std::move(slot);
        ++kept;
      }
      qp.tail = kept;
    }
    // In order: RC keeps them behind one another as they were first posted. A write
    // counts as held until it is on the wire again, so a failure half-way leaves the
    // rest to the close.
    for (uint64_t position = qp.head; connected.ok() && position != qp.tail; ++position) {
      VerbsQp::SendSlot& slot = qp.ring[position % qp.ring.size()];
      connected = PostSlot(qp, position);
      if (connected.ok()) {
        slot.held = false;
        --qp.held;
      }
    }
    if (connected.ok()) {
      qp.holding = false;
      qp.refused_window = 0;
      qp.renew_requested = false;
      qp.renew_deadline = absl::InfiniteFuture();
      qp.state = VerbsQp::State::kActive;
      qp.progress_at = absl::Now();  // the held writes are on the wire again
      renewing_.fetch_sub(1);
      renewals_.fetch_add(1);
    }
  }
  released.clear();
  for (const Completion& completion : refused) host_.handler().OnCompletion(completion);
  if (!connected.ok()) CloseQp(&qp, connected);
  return connected;
}

void Nic::ExpireRenewals() {
  const absl::Time now = absl::Now();
  for (uint32_t index = 0; index < sizing_.max_qps; ++index) {
    VerbsQp* qp = slots_[index].load(std::memory_order_acquire);
    if (qp == nullptr) continue;
    bool expired = false;
    {
      absl::MutexLock lock(&qp->mu);
      expired = qp->state == VerbsQp::State::kRenewing && qp->renew_deadline < now;
    }
    if (expired) {
      CloseQp(qp, absl::UnavailableError(absl::StrCat(
                      "QP ", qp->qp.qpn(), " on NIC ", index_, " was not renewed within ",
                      absl::FormatDuration(kRenewTimeout), " of a refusal")));
    }
  }
}

void Nic::ExpireStalledWrites() {
  const absl::Time now = absl::Now();
  for (uint32_t index = 0; index < sizing_.max_qps; ++index) {
    VerbsQp* qp = slots_[index].load(std::memory_order_acquire);
    if (qp == nullptr) continue;
    bool stalled = false;
    {
      absl::MutexLock lock(&qp->mu);
      // Only an active QP: a renewing one has kRenewTimeout, a closing one is flushing.
      stalled = qp->state == VerbsQp::State::kActive && qp->head != qp->tail &&
                now - qp->progress_at > sizing_.ack_timeout;
    }
    if (stalled) {
      ack_timeouts_.fetch_add(1, std::memory_order_relaxed);
      // UNAVAILABLE: the writes may go again on another QP; the reason tells the
      // engine the target may have stopped (it then asks the target's agent).
      CloseQp(qp, WithReason(absl::UnavailableError(
                                 absl::StrCat("QP ", qp->qp.qpn(), " on NIC ", index_,
                                              ": no write acknowledged in ",
                                              absl::FormatDuration(sizing_.ack_timeout),
                                              " (the target stopped answering)")),
                             reasons::kFabricAckTimeout));
    }
  }
}

}  // namespace fuselink::fabric::verbs
