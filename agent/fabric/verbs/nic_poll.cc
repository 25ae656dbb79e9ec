// The NIC's poller (verbs/nic.h): the completion queue's send and
// receive completions, a write's landing in its window, the QPs that have drained and
// are destroyed, and the device's asynchronous events.
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/verbs/host_shadow.h"
#include "agent/fabric/verbs/nic.h"

namespace fuselink::fabric::verbs {
namespace {

absl::Status WcStatus(const ibv_wc& wc, const absl::Status& close_reason) {
  const std::string what =
      absl::StrCat(ibv_wc_status_str(wc.status), " (vendor_err ", wc.vendor_err, ")");
  switch (wc.status) {
    case IBV_WC_SUCCESS:
      return absl::OkStatus();
    case IBV_WC_WR_FLUSH_ERR:  // the close's reason kept (FABRIC_ACK_TIMEOUT, ...)
      return WithPayloadsOf(
          absl::UnavailableError(absl::StrCat(
              "flushed, QP closed: ", close_reason.ok() ? what : close_reason.message())),
          close_reason);
    case IBV_WC_REM_ACCESS_ERR:
      // The target's NIC refused the rkey: the window's registration is gone (the
      // source posts only writes that one registered extent holds).
      return RefusalStatus(Refusal::kNoWindow);
    case IBV_WC_RNR_RETRY_EXC_ERR:
      // UNAVAILABLE: the writes may go again on another QP; the reason tells the
      // engine the target may have stopped (it then asks the target's agent).
      return WithReason(absl::UnavailableError(absl::StrCat(
                            "the target's receiver was not ready through every RC "
                            "retry (the target stopped receiving): ",
                            what)),
                        reasons::kFabricAckTimeout);
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_LOC_PROT_ERR:
      return absl::InternalError(absl::StrCat("local error: ", what));
    default:  // retry exceeded, RNR, fatal: the path or the peer is gone. rxe reports
              // a netdev that cannot transmit (link down) as IBV_WC_LOC_QP_OP_ERR.
      return absl::UnavailableError(what);
  }
}

}  // namespace

void Nic::Poll() {
  NameThisThread("fl-verbs-poll");
  SetThreadRole(ThreadRole::kFabric);  // blocks on its completion channel only
  ibv_wc completions[kPollBatch];
  int idle = 0;
  int sleep_us = 1;
  uint32_t loops = 0;
  uint32_t watch_loops = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    absl::StatusOr<int> polled = PollCq(cq_.get(), completions);
    const int count = polled.ok() ? *polled : 0;
    for (int i = 0; i < count; ++i) Handle(completions[i]);
    if (closing_.load(std::memory_order_acquire) > 0) FinalizeDrained();
    // A renewal waits on the peer; check its deadline now and then, busy or not.
    if (renewing_.load(std::memory_order_relaxed) > 0 && (++loops % 1024 == 0)) {
      ExpireRenewals();
    }
    // Every 1024 polls: about 200 ms apart on an idle NIC (kMaxIdleSleepUs each), far
    // more often on a busy one, so a stall is seen within ack_timeout + 0.2 s.
    if ((++watch_loops & 1023) == 0) ExpireStalledWrites();
    if (count > 0) {
      idle = 0;
      sleep_us = 1;
      continue;
    }
    if (++idle < kIdleSpins) continue;
    DrainAsyncEvents();
    usleep(sleep_us);
    sleep_us = std::min(2 * sleep_us, kMaxIdleSleepUs);
  }
}

void Nic::Handle(const ibv_wc& wc) {
  const wr_id::Fields id = wr_id::Decode(wc.wr_id);
  if (id.qp >= sizing_.max_qps) return;
  VerbsQp* qp = slots_[id.qp].load(std::memory_order_acquire);
  if (qp == nullptr || qp->generation != id.generation) return;  // stale: cannot happen
  if (id.recv) {
    HandleRecv(*qp, wc, id);
  } else {
    HandleSend(*qp, wc, id);
  }
}

bool Nic::HoldForRenewal(VerbsQp& qp, WindowKey refused_window) {
  if (qp.state != VerbsQp::State::kActive) return false;
  qp.state = VerbsQp::State::kRenewing;
  qp.holding = true;
  qp.refused_window = refused_window;
  qp.renew_deadline = absl::Now() + kRenewTimeout;
  renewing_.fetch_add(1);
  return true;
}

void Nic::HandleSend(VerbsQp& qp, const ibv_wc& wc, const wr_id::Fields& id) {
  std::optional<Completion> done;
  std::shared_ptr<const void> released;    // dropped outside the lock
  absl::Status failed = absl::OkStatus();  // an error that closes the QP
  bool renew = false;
  {
    absl::MutexLock lock(&qp.mu);
    VerbsQp::SendSlot& slot = qp.ring[id.slot % qp.ring.size()];
    if (qp.holding && !slot.reported) {
      // Flushed behind a refusal, never executed at the target: it stays in the ring
      // and is posted again once the QP is renewed. Counted once, at its SEND.
      if (!id.payload && !slot.held) {
        slot.held = true;
        ++qp.held;
      }
    } else {
      if (!slot.reported) {
        slot.reported = true;
        const bool refused = wc.status == IBV_WC_REM_ACCESS_ERR;
        done = Completion{.wr_id = slot.user_wr_id,
                          .nic = index_,
                          .bytes = slot.bytes,
                          .status = WcStatus(wc, qp.close_reason),
                          .refusal = refused ? Refusal::kNoWindow : Refusal::kNone};
        if (refused) {
          refused_.fetch_add(1, std::memory_order_relaxed);
          if (!HoldForRenewal(qp, slot.descriptor.key)) failed = done->status;
        } else if (wc.status != IBV_WC_SUCCESS && wc.status != IBV_WC_WR_FLUSH_ERR) {
          failed = done->status;
          if (wc.status == IBV_WC_RNR_RETRY_EXC_ERR) {
            ack_timeouts_.fetch_add(1, std::memory_order_relaxed);
          }
        }
      }
      if (!id.payload) {  // the SEND: the write's last CQE, in ring order
        released = std::move(slot.hold);
        ++qp.head;
        qp.progress_at = absl::Now();
        send_quota_used_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
    renew = ReadyToRenew(qp);
  }
  if (!failed.ok()) {
    CloseQp(&qp, WithPayloadsOf(absl::UnavailableError(absl::StrCat(
                                    "QP failed on NIC ", index_, ": ", failed.message())),
                                failed));
  }
  if (done.has_value()) {
    if (done->status.ok()) transmitted_bytes_.fetch_add(done->bytes);
    if (done->status.ok() || done->refusal != Refusal::kNone) {
      wire_tx_bytes_.fetch_add(done->bytes);
    }
    host_.handler().OnCompletion(*done);
  }
  if (renew) host_.OnQpRefused(qp.link, qp.shared_from_this());
}

void Nic::HandleRecv(VerbsQp& qp, const ibv_wc& wc, const wr_id::Fields& id) {
  PeerId peer = 0;
  absl::string_view peer_name;
  bool renew = false;
  bool errored_by_nic = false;
  {
    absl::MutexLock lock(&qp.mu);
    --qp.posted_recvs;
    peer = qp.peer;
    peer_name = qp.peer_name;  // fixed since Activate
    renew = ReadyToRenew(qp);
    // A QP that only receives learns that its NIC put it into error (a write it
    // refused, or a broken path) from its flushed receives alone.
    errored_by_nic = wc.status == IBV_WC_WR_FLUSH_ERR && !qp.sends() &&
                     qp.state == VerbsQp::State::kActive;
  }
  if (renew) host_.OnQpRefused(qp.link, qp.shared_from_this());
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status != IBV_WC_WR_FLUSH_ERR) {
      CloseQp(&qp, absl::UnavailableError(
                       absl::StrCat("receive failed: ", ibv_wc_status_str(wc.status))));
    } else if (errored_by_nic) {
      CloseQp(&qp, absl::UnavailableError(absl::StrCat(
                       "QP ", qp.qp.qpn(), " on NIC ", index_,
                       " went into error (a refused write, or a broken path)")));
    }
    return;
  }
  Descriptor descriptor;
  std::memcpy(
      &descriptor,
      recv_arena_.data() +
          (size_t{qp.index} * sizing_.recv_depth_per_qp + id.slot) * sizeof(Descriptor),
      sizeof(descriptor));
  // The NIC has placed the payload inside one of this peer's registrations; this
  // checks the descriptor's claim against the peer's open windows, as the TCP fabric
  // checks a WRITE header: a descriptor that disagrees closes the QP.
  bool well_formed =
      wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_WITH_IMM) != 0 &&
      wc.byte_len == sizeof(Descriptor) && peer != 0 &&
      descriptor.bytes <= sizing_.max_write_bytes &&
      (descriptor.bytes > 0 || (descriptor.key == 0 && descriptor.offset == 0));
  std::variant<WindowTable::Placement, Refusal> admitted = WindowTable::Placement();
  if (well_formed && descriptor.bytes > 0) {
    admitted =
        host_.Admit(descriptor.key, peer_name, descriptor.offset, descriptor.bytes);
    if (const Refusal* why = std::get_if<Refusal>(&admitted)) {
      // kNoWindow: its bytes landed before the window closed and its descriptor came
      // after: not delivered (the transfer is over). Anything else is a lie.
      well_formed = *why == Refusal::kNoWindow;
    }
  }
  if (!well_formed) {
    malformed_.fetch_add(1);
    CloseQp(&qp, absl::InvalidArgumentError(absl::StrCat(
                     "malformed arrival on NIC ", index_, ": window ", descriptor.key,
                     " offset ", descriptor.offset, " bytes ", descriptor.bytes)));
    return;
  }
  wire_rx_bytes_.fetch_add(descriptor.bytes);  // placed, whether delivered or not
  if (std::holds_alternative<Refusal>(admitted)) {
    refused_.fetch_add(1, std::memory_order_relaxed);
  } else {
    Arrival arrival{.peer = peer,
                    .peer_name = peer_name,
                    .nic = index_,
                    .window = descriptor.key,
                    .offset = descriptor.offset,
                    .bytes = descriptor.bytes,
                    .imm = ntohl(wc.imm_data)};
    auto& placement = std::get<WindowTable::Placement>(admitted);
    const bool staged = descriptor.bytes > 0 && placement.region().shadow != nullptr &&
                        placement.region().shadow->staged_on(index_);
    if (staged || landing_.load() > 0) {
      landing_.fetch_add(1);
      lander_->Run([this, placement = std::move(placement), arrival,
                    name = std::string(peer_name)]() mutable {
        arrival.peer_name = name;
        Land(placement, arrival);
        landing_.fetch_sub(1);
      });
    } else {
      received_bytes_.fetch_add(descriptor.bytes);
      host_.handler().OnArrival(arrival);
    }
  }
  admitted = Refusal::kNone;  // lets go of the placement: the handler has seen it
  absl::Status reposted;
  {
    absl::MutexLock lock(&qp.mu);
    if (qp.state == VerbsQp::State::kClosing) return;
    reposted = PostRecvSlot(qp, id.slot);
  }
  if (!reposted.ok()) CloseQp(&qp, reposted);
}

void Nic::Land(WindowTable::Placement& placement, Arrival arrival) {
  absl::Status copied;
  const Region* region = arrival.bytes > 0 ? &placement.region() : nullptr;
  if (region != nullptr && region->shadow != nullptr &&
      region->shadow->staged_on(index_)) {
    const uint8_t* from = region->shadow->At(arrival.offset, arrival.bytes);
    DeviceStager* stager = host_.device_stager();
    if (from == nullptr || stager == nullptr) {
      copied = absl::InternalError("the arrival is not inside one extent of its shadow");
    } else if (landing_stage_ == nullptr) {
      absl::StatusOr<std::unique_ptr<DeviceStage>> stage = stager->NewStage(index_);
      copied = stage.status();
      if (stage.ok()) landing_stage_ = *std::move(stage);
    }
    if (copied.ok()) {
      copied = landing_stage_->StartToDeviceFrom(
          region->gpu, reinterpret_cast<uint64_t>(region->base) + arrival.offset, from,
          arrival.bytes);
      copied.Update(landing_stage_->Wait());
    }
    if (absl::IsDeadlineExceeded(copied)) {
      // The copy may still read the shadow and write the region: the spent stage keeps
      // both until it ends, and the next arrival gets a new stage.
      landing_stage_->KeepWhileBusy(region->shadow);
      landing_stage_->KeepWhileBusy(placement.shared_region());
      landing_stage_.reset();
    }
  }
  if (!copied.ok()) {
    // Not delivered: the transfer's landing misses these bytes and says so in its
    // verdict; nothing was written to the GPU beyond what the copy reached.
    if (landing_failures_.fetch_add(1) == 0) {
      std::fprintf(stderr, "fuselink verbs: NIC %d could not copy a staged arrival: %s\n",
                   index_, copied.ToString().c_str());
    }
    return;
  }
  received_bytes_.fetch_add(arrival.bytes);
  host_.handler().OnArrival(arrival);
}

void Nic::FinalizeDrained() {
  // A QP's arrivals still with the lander are delivered before the QP is gone, and
  // so before its peer can be reported lost.
  if (landing_.load() > 0) return;
  for (uint32_t index = 0; index < sizing_.max_qps; ++index) {
    VerbsQp* qp = slots_[index].load(std::memory_order_acquire);
    if (qp == nullptr) continue;
    std::vector<Completion> forced;
    std::vector<std::shared_ptr<const void>> released;
    absl::Status why;
    {
      absl::MutexLock lock(&qp->mu);
      if (qp->state != VerbsQp::State::kClosing || qp->finalized || qp->busy) continue;
      // Every posted WR is back: held writes have nothing left on the wire.
      const bool drained = qp->tail - qp->head == qp->held && qp->posted_recvs == 0;
      if (!drained && !qp->force_drain) continue;
      // Held writes, and everything when the provider cannot flush.
      for (; qp->head != qp->tail; ++qp->head) {
        VerbsQp::SendSlot& slot = qp->ring[qp->head % qp->ring.size()];
        send_quota_used_.fetch_sub(1, std::memory_order_acq_rel);
        released.push_back(std::move(slot.hold));
        if (slot.reported) continue;
        forced.push_back(
            {.wr_id = slot.user_wr_id,
             .nic = index_,
             .bytes = slot.bytes,
             .status = WithPayloadsOf(absl::UnavailableError(absl::StrCat(
                                          "QP closed: ", qp->close_reason.message())),
                                      qp->close_reason)});
      }
      qp->held = 0;
      qp->finalized = true;
      why = qp->close_reason;
    }
    released.clear();
    for (const Completion& completion : forced) host_.handler().OnCompletion(completion);
    (void)qp->qp.Reset();  // destroy; nothing of it is left in the CQ
    host_.OnQpClosed(qp->link, qp, why);
    std::shared_ptr<VerbsQp> last;  // a renewal may still hold the object
    absl::MutexLock lock(&table_mu_);
    slots_[index].store(nullptr, std::memory_order_release);
    generations_[index] = (generations_[index] + 1) & wr_id::kGenerationMask;
    last = std::move(owned_[index]);
    --live_qps_;
    closing_.fetch_sub(1);
  }
}

void Nic::DrainAsyncEvents() {
  ibv_async_event event{};
  while (true) {
    absl::StatusOr<bool> got = TryGetAsyncEvent(context_.get(), &event);
    if (!got.ok() || !*got) return;
    switch (event.event_type) {
      case IBV_EVENT_PORT_ERR:
        CloseAll(absl::UnavailableError(absl::StrCat(
            "NIC ", index_, " (", binding_.port.device, ") port went down")));
        break;
      case IBV_EVENT_QP_FATAL:
      case IBV_EVENT_QP_REQ_ERR:
      case IBV_EVENT_QP_ACCESS_ERR:
        for (uint32_t i = 0; i < sizing_.max_qps; ++i) {
          VerbsQp* qp = slots_[i].load();
          if (qp != nullptr && qp->qp.get() == event.element.qp) {
            CloseQp(qp, absl::UnavailableError(absl::StrCat(
                            "QP error event: ", ibv_event_type_str(event.event_type))));
          }
        }
        break;
      default:
        break;
    }
  }
}

}  // namespace fuselink::fabric::verbs
