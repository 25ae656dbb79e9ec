#include "agent/fabric/verbs_nic.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/checks.h"
#include "agent/fabric/host_shadow.h"
#include "agent/fabric/socket.h"

namespace fuselink::fabric::verbs {
uint32_t RandomPsn() {
  static thread_local std::mt19937 random(std::random_device{}());
  return random() & 0xFFFFFF;
}

namespace {

absl::Status WcStatus(const ibv_wc& wc, const absl::Status& close_reason) {
  const std::string what =
      absl::StrCat(ibv_wc_status_str(wc.status), " (vendor_err ", wc.vendor_err, ")");
  switch (wc.status) {
    case IBV_WC_SUCCESS:
      return absl::OkStatus();
    case IBV_WC_WR_FLUSH_ERR:
      return absl::UnavailableError(absl::StrCat(
          "flushed, QP closed: ", close_reason.ok() ? what : close_reason.message()));
    case IBV_WC_REM_ACCESS_ERR:
      // The target's NIC refused the rkey: the window's registration is gone (the
      // source posts only writes that one registered extent holds).
      return RefusalStatus(Refusal::kNoWindow);
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_LOC_PROT_ERR:
      return absl::InternalError(absl::StrCat("local error: ", what));
    default:  // retry exceeded, RNR, fatal: the path or the peer is gone. rxe reports
              // a netdev that cannot transmit (link down) as IBV_WC_LOC_QP_OP_ERR.
      return absl::UnavailableError(what);
  }
}

}  // namespace

Nic::Nic(int index, NicBinding binding, const NicSizing& sizing, const RcParams& rc,
         NicHost& host)
    : index_(index),
      binding_(std::move(binding)),
      sizing_(sizing),
      rc_(rc),
      host_(host) {}

absl::StatusOr<std::unique_ptr<Nic>> Nic::Open(int index, NicBinding binding,
                                               const NicSizing& sizing,
                                               const RcParams& rc, NicHost& host) {
  const std::string context =
      absl::StrCat("NIC ", index, " (", binding.port.device, " port ", binding.port.port,
                   ", GID index ", binding.gid_index, ")");
  auto fail = [&](const absl::Status& status) { return WithContext(status, context); };
  const uint64_t cq_entries =
      2ull * sizing.queue_depth + uint64_t{sizing.max_qps} * sizing.recv_depth_per_qp;
  if (cq_entries > static_cast<uint64_t>(binding.port.max_cqe)) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "a CQ of ", cq_entries, " entries exceeds max_cqe ", binding.port.max_cqe)));
  }
  if (2 * sizing.send_depth_per_qp > static_cast<uint32_t>(binding.port.max_qp_wr) ||
      sizing.recv_depth_per_qp > static_cast<uint32_t>(binding.port.max_qp_wr)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("QP depths exceed max_qp_wr ", binding.port.max_qp_wr)));
  }
  if (sizing.max_window_registrations > static_cast<uint32_t>(binding.port.max_mr)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("max_window_registrations_per_nic ", sizing.max_window_registrations,
                     " exceeds the device's max_mr ", binding.port.max_mr)));
  }
  std::unique_ptr<Nic> nic(new Nic(index, std::move(binding), sizing, rc, host));
  absl::StatusOr<DeviceList> list = DeviceList::Get();
  if (!list.ok()) return fail(list.status());
  for (ibv_device* device : list->devices()) {
    if (nic->binding_.port.device != ibv_get_device_name(device)) continue;
    absl::StatusOr<Context> opened = OpenDevice(device);
    if (!opened.ok()) return fail(opened.status());
    nic->context_ = *std::move(opened);
  }
  if (!nic->context_) return fail(absl::NotFoundError("the device is gone"));
  if (absl::Status s = MakeAsyncFdNonBlocking(nic->context_.get()); !s.ok())
    return fail(s);
  absl::StatusOr<ProtectionDomain> pd = AllocPd(nic->context_.get());
  if (!pd.ok()) return fail(pd.status());
  nic->pd_ = *std::move(pd);
  absl::StatusOr<CompletionQueue> cq =
      CreateCq(nic->context_.get(), static_cast<int>(cq_entries));
  if (!cq.ok()) return fail(cq.status());
  nic->cq_ = *std::move(cq);
  nic->recv_arena_.resize(size_t{sizing.max_qps} * sizing.recv_depth_per_qp *
                          sizeof(Descriptor));
  absl::StatusOr<MemoryRegion> mr =
      RegisterMr(nic->pd_.get(), nic->recv_arena_.data(), nic->recv_arena_.size(),
                 IBV_ACCESS_LOCAL_WRITE);
  if (!mr.ok()) return fail(mr.status());
  nic->recv_mr_ = *std::move(mr);
  {
    absl::MutexLock lock(&nic->table_mu_);
    nic->owned_.resize(sizing.max_qps);
    nic->generations_.assign(sizing.max_qps, 0);
  }
  nic->slots_ = std::make_unique<std::atomic<VerbsQp*>[]>(sizing.max_qps);
  for (uint32_t i = 0; i < sizing.max_qps; ++i) nic->slots_[i].store(nullptr);
  if (host.device_stager() != nullptr) nic->lander_ = std::make_unique<Worker>();
  nic->poller_ = std::thread(&Nic::Poll, nic.get());
  return nic;
}

Nic::~Nic() {
  stop_.store(true);
  if (poller_.joinable()) poller_.join();
  // The table is empty (WaitUntilNoQps) and no domain is left (the fabric dropped its
  // windows); the MR, CQ, PD and context go in member order.
}

absl::StatusOr<std::shared_ptr<PeerDomain>> Nic::Domain(absl::string_view peer) {
  absl::MutexLock lock(&domains_mu_);
  auto it = domains_.find(std::string(peer));
  if (it != domains_.end()) {
    if (std::shared_ptr<PeerDomain> live = it->second.lock()) return live;
  }
  if (domains_.size() >= kMaxPeerDomainsPerNic) {
    std::erase_if(domains_, [](const auto& entry) { return entry.second.expired(); });
    if (domains_.size() >= kMaxPeerDomainsPerNic) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "NIC ", index_, " already holds ", kMaxPeerDomainsPerNic, " peer domains"));
    }
  }
  const std::string context = absl::StrCat("NIC ", index_, ": domain of '", peer, "'");
  absl::StatusOr<ProtectionDomain> pd = AllocPd(context_.get());
  if (!pd.ok()) return WithContext(pd.status(), context);
  auto domain = std::make_shared<PeerDomain>(std::string(peer), *std::move(pd));
  absl::StatusOr<MemoryRegion> arena = RegisterMr(
      domain->pd(), recv_arena_.data(), recv_arena_.size(), IBV_ACCESS_LOCAL_WRITE);
  if (!arena.ok()) return WithContext(arena.status(), context);
  domain->arena_ = *std::move(arena);
  domains_.insert_or_assign(std::string(peer), domain);
  return domain;
}

absl::StatusOr<VerbsQp*> Nic::CreateQp(uint64_t link,
                                       std::shared_ptr<PeerDomain> domain) {
  VerbsQp* raw = nullptr;
  {
    absl::MutexLock lock(&table_mu_);
    uint32_t index = 0;
    while (index < sizing_.max_qps && owned_[index] != nullptr) ++index;
    if (index == sizing_.max_qps) {
      return absl::ResourceExhaustedError(
          absl::StrCat("NIC ", index_, " already has ", sizing_.max_qps, " QPs"));
    }
    FL_ASSIGN_OR_RETURN(
        QueuePair qp,
        QueuePair::Create(domain != nullptr ? domain->pd() : pd_.get(), cq_.get(),
                          {.send_wrs = 2 * sizing_.send_depth_per_qp,
                           .recv_wrs = sizing_.recv_depth_per_qp,
                           .inline_bytes = sizeof(Descriptor)}));
    FL_RETURN_IF_ERROR(qp.ToInit(rc_));
    auto owned =
        std::make_shared<VerbsQp>(index, generations_[index], link, std::move(domain),
                                  std::move(qp), sizing_.send_depth_per_qp);
    raw = owned.get();
    {
      // Held for the caller (ReleaseNew): once published, CloseAll can close it, and a
      // QP with nothing posted is drained at once; the poller would destroy the ibv_qp
      // and free the object while the caller still posts its receives or connects it.
      absl::MutexLock qp_lock(&raw->mu);
      raw->busy = true;
    }
    // Published before the first receive is posted, so every CQE finds its QP.
    owned_[index] = std::move(owned);
    slots_[index].store(raw, std::memory_order_release);
    ++live_qps_;
  }
  host_.OnQpCreated(link);
  absl::Status posted;
  {
    absl::MutexLock qp_lock(&raw->mu);
    posted = PostRecvs(*raw);
  }
  if (!posted.ok()) {
    CloseQp(raw, posted);  // the ordinary teardown: ERR, flush, destroy
    ReleaseNew(raw);
    return posted;
  }
  return raw;
}

void Nic::ReleaseNew(VerbsQp* qp) {
  absl::MutexLock lock(&qp->mu);
  qp->busy = false;
  if (qp->error_deferred) {  // closed while held
    qp->error_deferred = false;
    if (!qp->qp.ToError().ok()) qp->force_drain = true;
  }
}

uint32_t Nic::qpn(const VerbsQp* qp) const { return qp->qp.qpn(); }
uint32_t Nic::psn(const VerbsQp* qp) const {
  absl::MutexLock lock(&qp->mu);
  return qp->local_psn;
}

void Nic::Activate(VerbsQp* qp, PeerId peer, absl::string_view name) {
  absl::MutexLock lock(&qp->mu);
  if (qp->state != VerbsQp::State::kInit) return;
  qp->state = VerbsQp::State::kActive;
  qp->peer = peer;
  qp->peer_name = std::string(name);
}

Nic::Takes Nic::takes_writes(VerbsQp* qp) const {
  absl::MutexLock lock(&qp->mu);
  switch (qp->state) {
    case VerbsQp::State::kActive:
      return Takes::kNow;
    case VerbsQp::State::kRenewing:
      return Takes::kLater;
    default:
      return Takes::kNo;
  }
}

absl::Status Nic::PostRecvSlot(VerbsQp& qp, uint32_t slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(recv_arena_.data()) +
             (size_t{qp.index} * sizing_.recv_depth_per_qp + slot) * sizeof(Descriptor);
  sge.length = sizeof(Descriptor);
  sge.lkey = qp.domain != nullptr ? qp.domain->arena_lkey() : recv_mr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = wr_id::Encode(
      {.slot = slot, .qp = qp.index, .generation = qp.generation, .recv = true});
  wr.sg_list = &sge;
  wr.num_sge = 1;
  FL_RETURN_IF_ERROR(PostRecv(qp.qp.get(), &wr));
  ++qp.posted_recvs;
  return absl::OkStatus();
}

absl::Status Nic::PostRecvs(VerbsQp& qp) {
  for (uint32_t slot = 0; slot < sizing_.recv_depth_per_qp; ++slot) {
    FL_RETURN_IF_ERROR(PostRecvSlot(qp, slot));
  }
  return absl::OkStatus();
}

absl::Status Nic::ConnectQp(VerbsQp* qp, const RemoteQp& remote) {
  RemoteQp path = remote;
  path.mtu = std::min(remote.mtu, mtu());
  RcParams rc = rc_;
  rc.gid_index = static_cast<uint8_t>(binding_.gid_index);
  rc.port = binding_.port.port;
  rc.infiniband = binding_.port.link_layer == IBV_LINK_LAYER_INFINIBAND;
  // Both ends of a rail must be on the same kind of link: a LID means InfiniBand.
  if (rc.infiniband != (remote.lid != 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "NIC ", index_, " is on ", rc.infiniband ? "InfiniBand" : "RoCE",
        " and the peer's port ", remote.lid != 0 ? "sends a LID" : "has no LID",
        ": both ends of a rail must share the link layer"));
  }
  uint32_t local_psn = 0;
  {
    absl::MutexLock lock(&qp->mu);
    qp->remote = path;
    local_psn = qp->local_psn;
  }
  FL_RETURN_IF_ERROR(qp->qp.ToRtr(rc, path));
  return qp->qp.ToRts(rc, local_psn);
}

void Nic::CloseQp(VerbsQp* qp, const absl::Status& why) {
  absl::MutexLock lock(&qp->mu);
  if (qp->state == VerbsQp::State::kClosing) return;
  if (qp->state == VerbsQp::State::kRenewing) renewing_.fetch_sub(1);
  qp->state = VerbsQp::State::kClosing;
  qp->close_reason = why;
  if (qp->busy) {
    qp->error_deferred = true;  // the renewal step moves it to ERR when it is done
  } else if (absl::Status error = qp->qp.ToError(); !error.ok()) {
    qp->force_drain = true;
  }
  closing_.fetch_add(1);
}

void Nic::CloseAll(const absl::Status& why) {
  std::vector<VerbsQp*> all;
  {
    absl::MutexLock lock(&table_mu_);
    for (const auto& qp : owned_) {
      if (qp != nullptr) all.push_back(qp.get());
    }
  }
  for (VerbsQp* qp : all) CloseQp(qp, why);
}

void Nic::WaitUntilNoQps() {
  absl::MutexLock lock(&table_mu_);
  table_mu_.Await(absl::Condition(this, &Nic::NoQps));
}

absl::Status Nic::PostSlot(VerbsQp& qp, uint64_t position) {
  const uint32_t slot = static_cast<uint32_t>(position % qp.ring.size());
  const VerbsQp::SendSlot& s = qp.ring[slot];
  ibv_sge descriptor_sge{};
  descriptor_sge.addr = reinterpret_cast<uintptr_t>(&s.descriptor);
  descriptor_sge.length = sizeof(s.descriptor);
  ibv_send_wr send{};
  send.wr_id = wr_id::Encode({.slot = slot, .qp = qp.index, .generation = qp.generation});
  send.opcode = IBV_WR_SEND_WITH_IMM;
  send.imm_data = htonl(s.imm);
  send.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  send.sg_list = &descriptor_sge;
  send.num_sge = 1;
  ibv_sge payload_sge{};
  ibv_send_wr write{};
  ibv_send_wr* first = &send;
  if (s.bytes > 0) {
    payload_sge.addr = s.source_address;
    payload_sge.length = s.bytes;
    payload_sge.lkey = s.lkey;
    write.wr_id = wr_id::Encode(
        {.slot = slot, .qp = qp.index, .generation = qp.generation, .payload = true});
    write.opcode = IBV_WR_RDMA_WRITE;
    write.sg_list = &payload_sge;
    write.num_sge = 1;
    write.wr.rdma.remote_addr = s.remote_address;
    write.wr.rdma.rkey = s.rkey;
    write.next = &send;
    first = &write;
  }
  if (absl::Status posted = PostSend(qp.qp.get(), first); !posted.ok()) {
    return WithContext(posted, absl::StrCat("NIC ", index_, " QP ", qp.qp.qpn()));
  }
  return absl::OkStatus();
}

absl::Status Nic::Post(VerbsQp* qp, const WriteOp& op, WriteSource source,
                       uint64_t remote_address, uint32_t rkey) {
  FL_RETURN_IF_ERROR(TakeWriteSlot(send_quota_used_, sizing_.queue_depth, index_));
  absl::MutexLock lock(&qp->mu);
  absl::Status refused;
  const bool renewing = qp->state == VerbsQp::State::kRenewing;
  if (qp->state != VerbsQp::State::kActive && !renewing) {
    refused = absl::UnavailableError(
        absl::StrCat("QP ", qp->qp.qpn(), " on NIC ", index_, " is closed"));
  } else if (qp->tail - qp->head >= qp->ring.size()) {
    refused = absl::ResourceExhaustedError(absl::StrCat(
        "QP ", qp->qp.qpn(), " has ", qp->ring.size(), " writes outstanding"));
  }
  if (!refused.ok()) {
    send_quota_used_.fetch_sub(1, std::memory_order_acq_rel);
    return refused;
  }
  const uint64_t position = qp->tail;
  qp->ring[position % qp->ring.size()] =
      VerbsQp::SendSlot{.user_wr_id = op.wr_id,
                        .bytes = op.bytes,
                        .imm = op.imm,
                        .source_address = source.address,
                        .lkey = source.lkey,
                        .rkey = rkey,
                        .remote_address = remote_address,
                        .descriptor = {.key = op.bytes > 0 ? op.remote_key : 0,
                                       .bytes = op.bytes,
                                       .offset = op.bytes > 0 ? op.remote_offset : 0},
                        .reported = false,
                        .held = renewing,
                        .hold = std::move(source.hold)};
  if (renewing) {
    // Queued behind the writes held for the renewal, posted with them in order.
    ++qp->held;
    ++qp->tail;
    return absl::OkStatus();
  }
  if (absl::Status posted = PostSlot(*qp, position); !posted.ok()) {
    qp->ring[position % qp->ring.size()].hold.reset();
    send_quota_used_.fetch_sub(1, std::memory_order_acq_rel);
    return posted;
  }
  ++qp->tail;
  return absl::OkStatus();
}

void Nic::Poll() {
  ibv_wc completions[kPollBatch];
  int idle = 0;
  int sleep_us = 1;
  uint32_t loops = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    absl::StatusOr<int> polled = PollCq(cq_.get(), completions);
    const int count = polled.ok() ? *polled : 0;
    for (int i = 0; i < count; ++i) Handle(completions[i]);
    if (closing_.load(std::memory_order_acquire) > 0) FinalizeDrained();
    // A renewal waits on the peer; check its deadline now and then, busy or not.
    if (renewing_.load(std::memory_order_relaxed) > 0 && (++loops % 1024 == 0)) {
      ExpireRenewals();
    }
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

void Nic::HandleSend(VerbsQp& qp, const ibv_wc& wc, const wr_id::Fields& id) {
  std::optional<Completion> done;
  std::shared_ptr<const void> released;  // dropped outside the lock
  bool failed = false;                   // an error that closes the QP
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
          if (qp.state == VerbsQp::State::kActive) {
            qp.state = VerbsQp::State::kRenewing;
            qp.holding = true;
            qp.refused_window = slot.descriptor.key;
            qp.renew_deadline = absl::Now() + kRenewTimeout;
            renewing_.fetch_add(1);
          } else {
            failed = true;
          }
        } else if (wc.status != IBV_WC_SUCCESS && wc.status != IBV_WC_WR_FLUSH_ERR) {
          failed = true;
        }
      }
      if (!id.payload) {  // the SEND: the write's last CQE, in ring order
        released = std::move(slot.hold);
        ++qp.head;
        send_quota_used_.fetch_sub(1, std::memory_order_acq_rel);
      }
    }
    renew = ReadyToRenew(qp);
  }
  if (failed) {
    CloseQp(&qp, absl::UnavailableError(absl::StrCat(
                     "QP failed: ", ibv_wc_status_str(wc.status), " on NIC ", index_)));
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
        forced.push_back({.wr_id = slot.user_wr_id,
                          .nic = index_,
                          .bytes = slot.bytes,
                          .status = absl::UnavailableError(
                              absl::StrCat("QP closed: ", qp->close_reason.message()))});
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
