#include "agent/fabric/verbs_link.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/region_table.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric::verbs {

ControlLink::ControlLink(LinkHost& host, Nic& nic, uint64_t id, Role role, UniqueFd fd)
    : host_(host), nic_(nic), id_(id), role_(role), fd_(std::move(fd)) {}

ControlLink::~ControlLink() {
  Close(absl::CancelledError("link destroyed"));
  Join();
}

void ControlLink::Start() {
  thread_ = std::thread([this] {
    absl::Status why = role_ == Role::kOutbound ? ServeOutbound() : ServeInbound();
    Close(why.ok() ? absl::UnavailableError("control connection ended") : why);
    {
      absl::MutexLock lock(&ack_mu_);
      ack_dead_ = true;
    }
    host_.OnLinkFinished(id_);
  });
}

void ControlLink::Join() {
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
    thread_.join();
  }
}

void ControlLink::Close(const absl::Status& why) {
  absl::MutexLock lock(&close_mu_);
  if (closed_) return;
  closed_ = true;
  close_reason_ = why;
  if (fd_.valid()) shutdown(fd_.get(), SHUT_RDWR);  // wakes the thread
  for (VerbsQp* qp : qps_) {
    if (qp != nullptr) nic_.CloseQp(qp, why);
  }
}

void ControlLink::Forget(VerbsQp* qp) {
  absl::MutexLock lock(&close_mu_);
  std::replace(qps_.begin(), qps_.end(), qp, static_cast<VerbsQp*>(nullptr));
}

VerbsQp* ControlLink::NextQp() {
  const size_t count = qps_.size();
  for (size_t tried = 0; tried < count; ++tried) {
    VerbsQp* qp = qps_[next_qp_.fetch_add(1, std::memory_order_relaxed) % count];
    if (qp != nullptr && nic_.active(qp)) return qp;
  }
  return nullptr;
}

std::optional<RemoteRegion> ControlLink::FindRemote(RegionKey key) const {
  absl::ReaderMutexLock lock(&remote_mu_);
  auto it = remote_.find(key);
  if (it == remote_.end()) return std::nullopt;
  return it->second;
}

absl::Status ControlLink::CreateQps(uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) {
    FL_ASSIGN_OR_RETURN(VerbsQp * qp, nic_.CreateQp(id_));
    absl::MutexLock lock(&close_mu_);
    qps_.push_back(qp);
    if (closed_) {
      nic_.CloseQp(qp, close_reason_);
      return close_reason_;
    }
  }
  return absl::OkStatus();
}

wire::Hello ControlLink::LocalHello(std::string name) const {
  wire::Hello hello{.nic = static_cast<uint32_t>(nic_.index()),
                    .mtu = static_cast<uint32_t>(nic_.mtu()),
                    .name = std::move(name),
                    .qps = {}};
  std::memcpy(hello.gid.data(), nic_.binding().gid.raw, wire::kGidBytes);
  for (VerbsQp* qp : qps_)
    hello.qps.push_back({.qpn = nic_.qpn(qp), .psn = nic_.psn(qp)});
  return hello;
}

absl::Status ControlLink::ConnectQps(const wire::HelloHeader& hello,
                                     const std::vector<wire::QpInfo>& infos) {
  if (infos.size() != qps_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer offers ", infos.size(), " QPs, expected ", qps_.size()));
  }
  for (size_t i = 0; i < qps_.size(); ++i) {
    RemoteQp remote{.qpn = infos[i].qpn,
                    .psn = infos[i].psn & 0xFFFFFF,
                    .mtu = static_cast<ibv_mtu>(hello.mtu)};
    std::memcpy(remote.gid.raw, hello.gid.data(), wire::kGidBytes);
    FL_RETURN_IF_ERROR(nic_.ConnectQp(qps_[i], remote));
  }
  return absl::OkStatus();
}

absl::Status ControlLink::SendFrame(const wire::Frame& frame) {
  wire::Frame copy = frame;
  iovec iov[1] = {{copy.data(), copy.size()}};
  return SendAll(fd_.get(), iov);
}

absl::StatusOr<wire::Decoded> ControlLink::ReadFrame() {
  wire::Frame frame;
  FL_RETURN_IF_ERROR(RecvAll(fd_.get(), frame.data(), frame.size()));
  return wire::DecodeFrame(frame);
}

absl::Status ControlLink::Handshake(absl::string_view node_name, uint32_t qp_count) {
  FL_RETURN_IF_ERROR(SetReceiveTimeout(fd_.get(), kHandshakeTimeoutMs));
  FL_RETURN_IF_ERROR(CreateQps(qp_count));
  FL_ASSIGN_OR_RETURN(std::string hello,
                      wire::EncodeHello(LocalHello(std::string(node_name))));
  {
    iovec iov[1] = {{hello.data(), hello.size()}};
    absl::MutexLock lock(&send_mu_);
    FL_RETURN_IF_ERROR(SendAll(fd_.get(), iov));
  }
  FL_ASSIGN_OR_RETURN(wire::Decoded reply, ReadFrame());
  if (const auto* refuse = std::get_if<wire::Refuse>(&reply)) {
    return absl::Status(refuse->code, "the peer refused the QP handshake");
  }
  const auto* header = std::get_if<wire::HelloHeader>(&reply);
  if (header == nullptr || header->name_bytes != 0 ||
      header->nic != static_cast<uint32_t>(nic_.index())) {
    return absl::InvalidArgumentError("expected a HELLO reply for this NIC");
  }
  std::vector<uint8_t> records(size_t{header->qp_count} * wire::kQpInfoBytes);
  FL_RETURN_IF_ERROR(RecvAll(fd_.get(), records.data(), records.size()));
  FL_RETURN_IF_ERROR(ConnectQps(*header, wire::DecodeQpInfos(records)));
  while (true) {
    FL_ASSIGN_OR_RETURN(wire::Decoded frame, ReadFrame());
    if (std::holds_alternative<wire::Ready>(frame)) break;
    FL_RETURN_IF_ERROR(ApplyRegionFrame(frame));
  }
  return SetReceiveTimeout(fd_.get(), 0);
}

absl::Status ControlLink::ApplyRegionFrame(const wire::Decoded& frame) {
  absl::MutexLock lock(&remote_mu_);
  if (const auto* add = std::get_if<wire::RegionAdd>(&frame)) {
    if (remote_.size() >= kMaxRegions && !remote_.contains(add->key)) {
      return absl::ResourceExhaustedError("peer pushed more than kMaxRegions regions");
    }
    remote_[add->key] = {.address = add->address, .rkey = add->rkey};
    return absl::OkStatus();
  }
  if (const auto* remove = std::get_if<wire::RegionRemove>(&frame)) {
    remote_.erase(remove->key);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError("expected a region frame");
}

absl::Status ControlLink::ServeOutbound() {
  while (true) {
    FL_ASSIGN_OR_RETURN(wire::Decoded frame, ReadFrame());
    FL_RETURN_IF_ERROR(ApplyRegionFrame(frame));
    uint64_t seq = 0;
    if (const auto* add = std::get_if<wire::RegionAdd>(&frame)) seq = add->seq;
    if (const auto* remove = std::get_if<wire::RegionRemove>(&frame)) seq = remove->seq;
    absl::MutexLock lock(&send_mu_);
    FL_RETURN_IF_ERROR(SendFrame(wire::EncodeAck({.seq = seq})));
  }
}

absl::Status ControlLink::AcceptHandshake() {
  FL_RETURN_IF_ERROR(SetReceiveTimeout(fd_.get(), kHandshakeTimeoutMs));
  FL_ASSIGN_OR_RETURN(wire::Decoded first, ReadFrame());
  const auto* header = std::get_if<wire::HelloHeader>(&first);
  if (header == nullptr) return absl::InvalidArgumentError("expected a HELLO");
  std::string name(header->name_bytes, '\0');
  FL_RETURN_IF_ERROR(RecvAll(fd_.get(), name.data(), name.size()));
  std::vector<uint8_t> records(size_t{header->qp_count} * wire::kQpInfoBytes);
  FL_RETURN_IF_ERROR(RecvAll(fd_.get(), records.data(), records.size()));
  absl::Status ready = fabric::wire::ValidateNodeName(name);
  if (ready.ok() && header->nic != static_cast<uint32_t>(nic_.index())) {
    ready = absl::InvalidArgumentError(
        absl::StrCat("HELLO for NIC ", header->nic, " on NIC ", nic_.index()));
  }
  if (ready.ok()) ready = CreateQps(header->qp_count);
  if (ready.ok()) ready = ConnectQps(*header, wire::DecodeQpInfos(records));
  if (ready.ok()) ready = host_.AttachInbound(id_, name).status();
  absl::MutexLock lock(&send_mu_);
  if (!ready.ok()) {
    (void)SendFrame(wire::EncodeRefuse({.code = ready.code()}));
    return ready;
  }
  FL_ASSIGN_OR_RETURN(std::string hello, wire::EncodeHello(LocalHello("")));
  iovec iov[1] = {{hello.data(), hello.size()}};
  FL_RETURN_IF_ERROR(SendAll(fd_.get(), iov));
  for (const wire::RegionAdd& add : host_.StartPushing(id_)) {
    FL_RETURN_IF_ERROR(SendFrame(wire::EncodeRegionAdd(add)));
  }
  FL_RETURN_IF_ERROR(SendFrame(wire::EncodeReady()));
  return SetReceiveTimeout(fd_.get(), 0);
}

absl::Status ControlLink::ServeInbound() {
  FL_RETURN_IF_ERROR(AcceptHandshake());
  while (true) {
    FL_ASSIGN_OR_RETURN(wire::Decoded frame, ReadFrame());
    const auto* ack = std::get_if<wire::Ack>(&frame);
    if (ack == nullptr) return absl::InvalidArgumentError("expected an ACK");
    absl::MutexLock lock(&ack_mu_);
    acked_seq_ = std::max(acked_seq_, ack->seq);
  }
}

absl::Status ControlLink::PushAdd(wire::RegionAdd add) {
  {
    absl::MutexLock lock(&send_mu_);
    add.seq = next_seq_++;
    FL_RETURN_IF_ERROR(SendFrame(wire::EncodeRegionAdd(add)));
  }
  absl::MutexLock lock(&ack_mu_);
  struct Args {
    const uint64_t* acked;
    const bool* dead;
    uint64_t seq;
  } args{&acked_seq_, &ack_dead_, add.seq};
  if (!ack_mu_.AwaitWithTimeout(
          absl::Condition(
              +[](Args* a) { return *a->acked >= a->seq || *a->dead; }, &args),
          kRegionAckTimeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("no ACK for region ", add.key, " on NIC ", nic_.index()));
  }
  if (acked_seq_ < add.seq) {
    return absl::UnavailableError("control connection closed before the ACK");
  }
  return absl::OkStatus();
}

void ControlLink::PushRemove(RegionKey key) {
  absl::MutexLock lock(&send_mu_);
  (void)SendFrame(wire::EncodeRegionRemove({.key = key, .seq = next_seq_++}));
}

}  // namespace fuselink::fabric::verbs
