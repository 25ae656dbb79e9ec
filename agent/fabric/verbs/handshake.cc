// The control link's handshake (verbs/link.h), on either side: its QPs created and held
// while in use, HELLO, CHALLENGE and PROOF, the QPs connected, the peer's window read.
#include "agent/fabric/handshake.h"

#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/verbs/link.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric::verbs {
namespace {

// The REFUSE that tells a source why its handshake failed here: the code, and the
// peer's share where that was the reason.
wire::Frame RefuseFrame(const absl::Status& why) {
  wire::Refuse refuse{.code = why.code(), .why = std::nullopt};
  if (ReasonOf(why) == reasons::kFabricPeerConnections) {
    refuse.why = fabric::wire::ConnectionRefusal::kPeerConnections;
  }
  return wire::EncodeRefuse(refuse);
}

// What a source's Handshake returns for the target's REFUSE.
absl::Status Refused(const wire::Refuse& refuse) {
  if (refuse.why == fabric::wire::ConnectionRefusal::kPeerConnections) {
    return WithReason(absl::Status(refuse.code,
                                   "the peer refused the control connection: this node "
                                   "holds its share of control connections there"),
                      reasons::kFabricPeerConnections);
  }
  return absl::Status(refuse.code, "the peer refused the QP handshake");
}

}  // namespace

absl::Status ControlLink::CreateQps(uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) {
    FL_ASSIGN_OR_RETURN(VerbsQp * qp, nic_.CreateQp(id_, domain_));
    absl::MutexLock lock(&close_mu_);
    qps_.push_back(qp);  // in qps_: Close() reaches it; still held (ReleaseQps)
    if (closed_) {
      nic_.CloseQp(qp, close_reason_);
      return close_reason_;
    }
  }
  return absl::OkStatus();
}

void ControlLink::ReleaseQps() {
  absl::MutexLock lock(&close_mu_);
  for (VerbsQp* qp : qps_) {
    if (qp != nullptr) nic_.ReleaseNew(qp);  // from here on Forget() may drop it
  }
}

wire::Hello ControlLink::LocalHello(std::string name) const {
  wire::Hello hello{.nic = static_cast<uint32_t>(nic_.index()),
                    .mtu = static_cast<uint32_t>(nic_.mtu()),
                    .lid = nic_.binding().lid,
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
                    .mtu = static_cast<ibv_mtu>(hello.mtu),
                    .lid = hello.lid};
    std::memcpy(remote.gid.raw, hello.gid.data(), wire::kGidBytes);
    FL_RETURN_IF_ERROR(nic_.ConnectQp(qps_[i], remote));
  }
  return absl::OkStatus();
}

absl::Status ControlLink::Handshake(absl::string_view node_name,
                                    absl::string_view peer_name, const SessionKey& key,
                                    uint32_t qp_count) {
  FL_RETURN_IF_ERROR(SetReceiveTimeout(fd_.get(), kHandshakeTimeoutMs));
  FL_RETURN_IF_ERROR(SetSendTimeout(fd_.get(), kControlSendTimeoutMs));
  absl::Cleanup release = [this] { ReleaseQps(); };
  FL_RETURN_IF_ERROR(CreateQps(qp_count));
  handshake::Transcript transcript{.connector = node_name,
                                   .acceptor = peer_name,
                                   .nic = static_cast<uint32_t>(nic_.index())};
  FL_ASSIGN_OR_RETURN(transcript.client_nonce, handshake::NewNonce());
  wire::Hello local = LocalHello(std::string(node_name));
  local.client_nonce = transcript.client_nonce;
  FL_ASSIGN_OR_RETURN(std::string hello, wire::EncodeHello(local));
  {
    iovec iov[1] = {{hello.data(), hello.size()}};
    absl::MutexLock lock(&send_mu_);
    FL_RETURN_IF_ERROR(SendAll(fd_.get(), iov));
  }
  absl::StatusOr<wire::Decoded> first = ReadFrame(Reading::kHandshake);
  const auto* challenge = first.ok() ? std::get_if<wire::Challenge>(&*first) : nullptr;
  if (challenge == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "the target did not answer HELLO with a CHALLENGE (does it hold a fabric key "
        "for this node?)",
        first.ok() ? "" : absl::StrCat(": ", first.status().message())));
  }
  transcript.server_nonce = challenge->server_nonce;
  FL_RETURN_IF_ERROR(
      handshake::VerifyMac(key, handshake::Side::kAcceptor, transcript, challenge->mac));
  FL_ASSIGN_OR_RETURN(
      const handshake::Mac mac_c,
      handshake::ComputeMac(key, handshake::Side::kConnector, transcript));
  {
    absl::MutexLock lock(&send_mu_);
    FL_RETURN_IF_ERROR(SendFrame(wire::EncodeProof({.mac = mac_c})));
  }
  FL_ASSIGN_OR_RETURN(wire::Decoded reply, ReadFrame(Reading::kHandshake));
  if (const auto* refuse = std::get_if<wire::Refuse>(&reply)) return Refused(*refuse);
  const auto* header = std::get_if<wire::HelloHeader>(&reply);
  if (header == nullptr || header->name_bytes != 0 ||
      header->client_nonce != handshake::Nonce{} ||
      header->nic != static_cast<uint32_t>(nic_.index())) {
    return absl::InvalidArgumentError("expected a HELLO reply for this NIC");
  }
  std::vector<uint8_t> records(size_t{header->qp_count} * wire::kQpInfoBytes);
  FL_RETURN_IF_ERROR(RecvAll(fd_.get(), records.data(), records.size()));
  FL_RETURN_IF_ERROR(ConnectQps(*header, wire::DecodeQpInfos(records)));
  while (true) {
    FL_ASSIGN_OR_RETURN(wire::Decoded frame, ReadFrame(Reading::kHandshake));
    if (std::holds_alternative<wire::Ready>(frame)) break;
    const auto* add = std::get_if<wire::WindowAdd>(&frame);
    if (add == nullptr) return absl::InvalidArgumentError("expected WINDOW_ADD or READY");
    FL_RETURN_IF_ERROR(ApplyWindowAdd(*add, Reading::kHandshake));
  }
  return absl::OkStatus();  // ServeOutbound sets the receive timeout it reads with
}

absl::StatusOr<std::string> ControlLink::Authenticate(std::vector<uint8_t>& records) {
  // The whole exchange fits in one kHandshakeTimeoutMs, however the source spreads
  // its bytes out.
  const absl::Time deadline = absl::Now() + absl::Milliseconds(kHandshakeTimeoutMs);
  FL_ASSIGN_OR_RETURN(wire::Decoded first, ReadFrameBefore(deadline));
  const auto* header = std::get_if<wire::HelloHeader>(&first);
  if (header == nullptr) return absl::InvalidArgumentError("expected a HELLO");
  remote_hello_ = *header;
  std::string name(header->name_bytes, '\0');  // at most kMaxNameBytes
  FL_RETURN_IF_ERROR(RecvAllBefore(fd_.get(), name.data(), name.size(), deadline));
  records.resize(size_t{header->qp_count} * wire::kQpInfoBytes);  // bounded by decode
  FL_RETURN_IF_ERROR(RecvAllBefore(fd_.get(), records.data(), records.size(), deadline));
  FL_RETURN_IF_ERROR(fabric::wire::ValidateNodeName(name));
  if (header->nic != static_cast<uint32_t>(nic_.index())) {
    return absl::InvalidArgumentError(
        absl::StrCat("HELLO for NIC ", header->nic, " on NIC ", nic_.index()));
  }
  FL_ASSIGN_OR_RETURN(const SessionKey key,
                      handshake::AcceptorKeyFor(host_.keys(), name));
  handshake::Transcript transcript{.connector = name,
                                   .acceptor = host_.node_name(),
                                   .nic = static_cast<uint32_t>(nic_.index()),
                                   .client_nonce = header->client_nonce};
  FL_ASSIGN_OR_RETURN(transcript.server_nonce, handshake::NewNonce());
  FL_ASSIGN_OR_RETURN(const handshake::Mac mac_a,
                      handshake::ComputeMac(key, handshake::Side::kAcceptor, transcript));
  {
    absl::MutexLock lock(&send_mu_);
    FL_RETURN_IF_ERROR(SendFrame(
        wire::EncodeChallenge({.server_nonce = transcript.server_nonce, .mac = mac_a})));
  }
  FL_ASSIGN_OR_RETURN(wire::Decoded second, ReadFrameBefore(deadline));
  const auto* proof = std::get_if<wire::Proof>(&second);
  if (proof == nullptr) return absl::InvalidArgumentError("expected a PROOF");
  FL_RETURN_IF_ERROR(
      handshake::VerifyMac(key, handshake::Side::kConnector, transcript, proof->mac));
  FL_RETURN_IF_ERROR(SetReceiveTimeout(fd_.get(), kHandshakeTimeoutMs));
  return name;
}

absl::Status ControlLink::AcceptHandshake() {
  FL_RETURN_IF_ERROR(SetReceiveTimeout(fd_.get(), kHandshakeTimeoutMs));
  FL_RETURN_IF_ERROR(SetSendTimeout(fd_.get(), kControlSendTimeoutMs));
  std::vector<uint8_t> records;
  absl::StatusOr<std::string> proven = Authenticate(records);
  if (!proven.ok()) {
    // Closed by this side (the fabric going away): no failure of the source's. Either
    // way it gets no REFUSE: nothing it could learn from one.
    bool closed_here;
    {
      absl::MutexLock lock(&close_mu_);
      closed_here = closed_;
    }
    if (!closed_here) nic_.CountAuthFailure();
    return proven.status();
  }
  const std::string name = *std::move(proven);
  // Past its peer's share: refused before it costs a QP (its REFUSE says why).
  if (absl::Status admitted = host_.AdmitInbound(id_, name); !admitted.ok()) {
    absl::MutexLock lock(&send_mu_);
    (void)SendFrame(RefuseFrame(admitted));
    return admitted;
  }
  const wire::HelloHeader* header = &remote_hello_;
  // The peer's QPs live in its own protection domain: it reaches its windows only.
  absl::StatusOr<std::shared_ptr<PeerDomain>> domain = nic_.Domain(name);
  if (domain.ok()) domain_ = *std::move(domain);
  absl::Status ready = domain.status();
  absl::Cleanup release = [this] { ReleaseQps(); };
  if (ready.ok()) ready = CreateQps(header->qp_count);
  if (ready.ok()) ready = ConnectQps(*header, wire::DecodeQpInfos(records));
  if (ready.ok()) {
    absl::StatusOr<PeerId> peer = host_.AttachInbound(id_, name);
    ready = peer.status();
    if (peer.ok()) {
      peer_ = *peer;
      absl::MutexLock lock(&close_mu_);
      peer_name_ = name;
    }
  }
  absl::MutexLock lock(&send_mu_);
  if (!ready.ok()) {
    (void)SendFrame(RefuseFrame(ready));
    return ready;
  }
  FL_ASSIGN_OR_RETURN(std::string hello, wire::EncodeHello(LocalHello("")));
  iovec iov[1] = {{hello.data(), hello.size()}};
  FL_RETURN_IF_ERROR(SendAll(fd_.get(), iov));
  for (const WindowPush& push : host_.StartPushing(id_)) {
    // Sequence 0: read before READY, inside the source's handshake; not ACKed.
    FL_ASSIGN_OR_RETURN(std::string add,
                        wire::EncodeWindowAdd(push.key, push.iova_base, 0, push.records));
    iovec add_iov[1] = {{add.data(), add.size()}};
    FL_RETURN_IF_ERROR(SendAll(fd_.get(), add_iov));
  }
  return SendFrame(wire::EncodeReady());  // ServeInbound sets its receive timeout
}

}  // namespace fuselink::fabric::verbs
