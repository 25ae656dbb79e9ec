#include "agent/fabric/verbs/nic.h"

#include <arpa/inet.h>

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/checks.h"
#include "agent/fabric/socket.h"

namespace fuselink::fabric::verbs {
uint32_t RandomPsn() {
  static thread_local std::mt19937 random(std::random_device{}());
  return random() & 0xFFFFFF;
}

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
  if (host.device_stager() != nullptr)
    nic->lander_ = std::make_unique<Worker>("fl-verbs-land");
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
  EndBusy(*qp);
}

bool Nic::EndBusy(VerbsQp& qp) {
  qp.busy = false;
  if (!qp.error_deferred) return false;
  qp.error_deferred = false;
  if (!qp.qp.ToError().ok()) qp.force_drain = true;
  return true;
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
  // Owning copies: a QP another close drained may be freed by the poller meanwhile.
  std::vector<std::shared_ptr<VerbsQp>> all;
  {
    absl::MutexLock lock(&table_mu_);
    for (const auto& qp : owned_) {
      if (qp != nullptr) all.push_back(qp);
    }
  }
  for (const auto& qp : all) CloseQp(qp.get(), why);
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
  if (qp->head == qp->tail) qp->progress_at = absl::Now();  // the first of a run
  ++qp->tail;
  return absl::OkStatus();
}

}  // namespace fuselink::fabric::verbs
