#include "agent/fabric/verbs/link.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
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
    NameThisThread("fl-verbs-link");
    absl::Status why = role_ == Role::kOutbound ? ServeOutbound() : ServeInbound();
    Close(why.ok() ? absl::UnavailableError("control connection ended") : why);
    {
      absl::MutexLock lock(&ack_mu_);
      ack_dead_ = true;
    }
    FailQueries(absl::UnavailableError(
        absl::StrCat("control connection on NIC ", nic_.index(),
                     " closed before the target answered: ", close_reason().message())));
    {
      absl::MutexLock lock(&renew_mu_);
      renewing_.clear();  // their QPs are closing with the link
    }
    host_.OnLinkFinished(id_);
  });
}

void ControlLink::Join() {
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
    thread_.join();
  }
}

absl::Status ControlLink::close_reason() const {
  absl::MutexLock lock(&close_mu_);
  return close_reason_;
}

bool ControlLink::closed() const {
  absl::MutexLock lock(&close_mu_);
  return closed_;
}

std::string ControlLink::peer_name() const {
  absl::MutexLock lock(&close_mu_);
  return peer_name_;
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
  VerbsQp* later = nullptr;  // one being renewed: only when no other takes writes now
  for (size_t tried = 0; tried < count; ++tried) {
    VerbsQp* qp = qps_[next_qp_.fetch_add(1, std::memory_order_relaxed) % count];
    if (qp == nullptr) continue;
    const Nic::Takes takes = nic_.takes_writes(qp);
    if (takes == Nic::Takes::kNow) return qp;
    if (takes == Nic::Takes::kLater && later == nullptr) later = qp;
  }
  return later;
}

absl::Status ControlLink::SendFrame(const wire::Frame& frame) {
  wire::Frame copy = frame;
  iovec iov[1] = {{copy.data(), copy.size()}};
  return SendAll(fd_.get(), iov);
}

absl::Status ControlLink::Receive(void* data, size_t bytes, Reading reading, bool begun) {
  if (reading == Reading::kHandshake) return RecvAll(fd_.get(), data, bytes);
  absl::Status received =
      RecvAllUnlessStalled(fd_.get(), data, bytes, host_.stall_timeout_ms(), begun);
  if (ReasonOf(received) == reasons::kFabricStall) nic_.CountStalledLink();
  return received;
}

absl::StatusOr<wire::Decoded> ControlLink::ReadFrame(Reading reading) {
  wire::Frame frame;
  FL_RETURN_IF_ERROR(Receive(frame.data(), frame.size(), reading, /*begun=*/false));
  return wire::DecodeFrame(frame);
}

absl::StatusOr<wire::Decoded> ControlLink::ReadFrameBefore(absl::Time deadline) {
  wire::Frame frame;
  FL_RETURN_IF_ERROR(RecvAllBefore(fd_.get(), frame.data(), frame.size(), deadline));
  return wire::DecodeFrame(frame);
}

absl::Status ControlLink::ApplyWindowAdd(const wire::WindowAdd& add, Reading reading) {
  std::vector<uint8_t> bytes(size_t{add.extent_count} * wire::kWindowRecordBytes);
  FL_RETURN_IF_ERROR(Receive(bytes.data(), bytes.size(), reading, /*begun=*/true));
  FL_ASSIGN_OR_RETURN(std::vector<wire::WindowRecord> records,
                      wire::DecodeWindowRecords(bytes));
  FL_ASSIGN_OR_RETURN(RemoteWindow window,
                      RemoteWindow::FromRecords(add.iova_base, records));
  return remote_windows_.Add(add.key, std::move(window));
}

absl::Status ControlLink::ServeOutbound() {
  FL_RETURN_IF_ERROR(
      SetReceiveTimeout(fd_.get(), TickMs(host_.stall_timeout_ms(), kStallTicks)));
  while (true) {
    FL_ASSIGN_OR_RETURN(wire::Decoded frame, ReadFrame(Reading::kServing));
    uint64_t ack = 0;
    if (const auto* add = std::get_if<wire::WindowAdd>(&frame)) {
      FL_RETURN_IF_ERROR(ApplyWindowAdd(*add, Reading::kServing));
      ack = add->seq;
    } else if (const auto* remove = std::get_if<wire::WindowRemove>(&frame)) {
      remote_windows_.Remove(remove->key);
      ack = remove->seq;
    } else if (const auto* verdict = std::get_if<wire::Verdict>(&frame)) {
      FL_RETURN_IF_ERROR(ApplyVerdict(*verdict));
      continue;
    } else if (const auto* renewed = std::get_if<wire::QpRenewed>(&frame)) {
      std::shared_ptr<VerbsQp> qp;
      {
        absl::MutexLock lock(&renew_mu_);
        if (renewed->index < renewing_.size()) qp = std::move(renewing_[renewed->index]);
      }
      if (qp == nullptr) return absl::InvalidArgumentError("QP_RENEWED not asked for");
      // On failure ResumeQp closes the QP; its held writes complete UNAVAILABLE.
      (void)nic_.ResumeQp(*qp, renewed->qpn, renewed->psn);
      continue;
    } else {
      return absl::InvalidArgumentError("unexpected frame from the target");
    }
    absl::MutexLock lock(&send_mu_);
    FL_RETURN_IF_ERROR(SendFrame(wire::EncodeAck({.seq = ack})));
  }
}

absl::Status ControlLink::ServeInbound() {
  FL_RETURN_IF_ERROR(AcceptHandshake());
  const std::string name = peer_name();
  FL_RETURN_IF_ERROR(
      SetReceiveTimeout(fd_.get(), TickMs(host_.stall_timeout_ms(), kStallTicks)));
  while (true) {
    FL_ASSIGN_OR_RETURN(wire::Decoded frame, ReadFrame(Reading::kServing));
    if (const auto* ack = std::get_if<wire::Ack>(&frame)) {
      absl::MutexLock lock(&ack_mu_);
      acked_seq_ = std::max(acked_seq_, ack->seq);
    } else if (const auto* query = std::get_if<wire::Query>(&frame)) {
      const Refusal refusal = host_.Judge(query->key, name, query->offset, query->bytes);
      if (refusal != Refusal::kNone) nic_.CountRefused();
      absl::MutexLock lock(&send_mu_);
      FL_RETURN_IF_ERROR(
          SendFrame(wire::EncodeVerdict({.refusal = refusal, .seq = query->seq})));
    } else if (const auto* renew = std::get_if<wire::QpRenew>(&frame)) {
      FL_RETURN_IF_ERROR(RenewInbound(*renew));
    } else {
      return absl::InvalidArgumentError("unexpected frame from the source");
    }
  }
}

absl::Status ControlLink::RenewInbound(const wire::QpRenew& renew) {
  VerbsQp* old = nullptr;
  {
    absl::MutexLock lock(&close_mu_);
    if (renew.index >= qps_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("QP_RENEW for QP ", renew.index, " of ", qps_.size()));
    }
    old = qps_[renew.index];
    // The QP the refusal broke: in error at the NIC already, torn down the usual way.
    if (old != nullptr) nic_.CloseQp(old, absl::UnavailableError("renewed by the peer"));
  }
  // Held (busy) until it is in qps_: the fabric's teardown (Nic::CloseAll) can close
  // it before then, and the poller must not destroy and free it under us.
  FL_ASSIGN_OR_RETURN(VerbsQp * qp, nic_.CreateQp(id_, domain_));
  RemoteQp remote{.qpn = renew.qpn,
                  .psn = renew.psn,
                  .mtu = static_cast<ibv_mtu>(remote_hello_.mtu),
                  .lid = remote_hello_.lid};
  std::memcpy(remote.gid.raw, remote_hello_.gid.data(), wire::kGidBytes);
  absl::Status connected = nic_.ConnectQp(qp, remote);
  if (!connected.ok()) {
    nic_.CloseQp(qp, connected);
    nic_.ReleaseNew(qp);
    return connected;
  }
  nic_.Activate(qp, peer_, peer_name());
  // Read while held: once released, a Close() may let the poller free it.
  const uint32_t qpn = nic_.qpn(qp);
  const uint32_t psn = nic_.psn(qp);
  {
    absl::MutexLock lock(&close_mu_);
    if (closed_) {
      nic_.CloseQp(qp, close_reason_);
      nic_.ReleaseNew(qp);
      return close_reason_;
    }
    qps_[renew.index] = qp;
    nic_.ReleaseNew(qp);
  }
  absl::MutexLock lock(&send_mu_);
  return SendFrame(wire::EncodeQpRenewed(
      {.index = renew.index, .qpn = qpn, .psn = psn, .seq = renew.seq}));
}

void ControlLink::Renew(std::shared_ptr<VerbsQp> qp) {
  uint32_t index = 0;
  {
    absl::MutexLock lock(&close_mu_);
    auto it = std::find(qps_.begin(), qps_.end(), qp.get());
    if (closed_ || it == qps_.end()) return;  // closing: its writes complete UNAVAILABLE
    index = static_cast<uint32_t>(it - qps_.begin());
  }
  absl::StatusOr<uint32_t> psn = nic_.RestartQp(*qp);
  if (!psn.ok()) return;  // closed by RestartQp
  const uint32_t qpn = nic_.qpn(qp.get());
  {
    absl::MutexLock lock(&renew_mu_);
    if (renewing_.size() < qps_.size()) renewing_.resize(qps_.size());
    renewing_[index] = std::move(qp);
  }
  absl::Status sent;
  {
    absl::MutexLock lock(&send_mu_);
    sent = SendFrame(wire::EncodeQpRenew(
        {.index = index, .qpn = qpn, .psn = *psn, .seq = next_seq_++}));
  }
  if (!sent.ok()) Close(sent);
}

absl::Status ControlLink::AskTarget(const WriteOp& op) {
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&queries_mu_);
    if (queries_closed_) {
      return absl::UnavailableError(
          absl::StrCat("control connection on NIC ", nic_.index(), " is closed"));
    }
    auto free = std::find_if(queries_.begin(), queries_.end(),
                             [](const PendingQuery& q) { return !q.used; });
    if (free == queries_.end()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("NIC ", nic_.index(), " already has ", kMaxPendingQueries,
                       " refused writes waiting for the target's reason"));
    }
    seq = next_query_seq_++;
    *free = PendingQuery{.used = true,
                         .sent = false,
                         .seq = seq,
                         .key = op.remote_key,
                         .offset = op.remote_offset,
                         .wr_id = op.wr_id,
                         .bytes = op.bytes};
  }
  host_.RunOnWorker([self = shared_from_this(), seq] { self->SendQuery(seq); });
  return absl::OkStatus();
}

void ControlLink::SendQuery(uint64_t seq) {
  wire::Query query{.seq = seq};
  {
    absl::MutexLock lock(&queries_mu_);
    auto it = std::find_if(queries_.begin(), queries_.end(),
                           [&](const PendingQuery& q) { return q.used && q.seq == seq; });
    if (it == queries_.end()) return;  // failed meanwhile
    it->sent = true;
    query.key = it->key;
    query.offset = it->offset;
    query.bytes = it->bytes;
  }
  absl::Status sent;
  {
    absl::MutexLock lock(&send_mu_);
    sent = SendFrame(wire::EncodeQuery(query));
  }
  if (!sent.ok()) Close(sent);  // the link's thread then fails the query
}

absl::Status ControlLink::ApplyVerdict(const wire::Verdict& verdict) {
  Completion done;
  done.nic = nic_.index();
  {
    absl::MutexLock lock(&queries_mu_);
    auto it = std::find_if(queries_.begin(), queries_.end(), [&](const PendingQuery& q) {
      return q.used && q.sent && q.seq == verdict.seq;
    });
    if (it == queries_.end()) return absl::InvalidArgumentError("VERDICT not asked for");
    done.wr_id = it->wr_id;
    done.bytes = it->bytes;
    it->used = false;
  }
  if (verdict.refusal == Refusal::kNone) {
    // The target would place it, but this NIC holds no registration for it: the window
    // reached the target's other NICs only, or its push is still under way.
    done.status = absl::UnavailableError(absl::StrCat(
        "NIC ", nic_.index(), " has no registration for the write; the target has"));
  } else {
    done.status = RefusalStatus(verdict.refusal);
    done.refusal = verdict.refusal;
  }
  host_.handler().OnCompletion(done);
  return absl::OkStatus();
}

void ControlLink::FailQueries(const absl::Status& why) {
  std::vector<Completion> failed;
  {
    absl::MutexLock lock(&queries_mu_);
    queries_closed_ = true;
    for (PendingQuery& q : queries_) {
      if (!q.used) continue;
      failed.push_back(
          {.wr_id = q.wr_id, .nic = nic_.index(), .bytes = q.bytes, .status = why});
      q.used = false;
    }
  }
  for (const Completion& c : failed) host_.handler().OnCompletion(c);
}

absl::Status ControlLink::PushWindow(const WindowPush& push) {
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&send_mu_);
    seq = next_seq_++;
    FL_ASSIGN_OR_RETURN(std::string add, wire::EncodeWindowAdd(push.key, push.iova_base,
                                                               seq, push.records));
    iovec iov[1] = {{add.data(), add.size()}};
    FL_RETURN_IF_ERROR(SendAll(fd_.get(), iov));
  }
  absl::MutexLock lock(&ack_mu_);
  struct Args {
    const uint64_t* acked;
    const bool* dead;
    uint64_t seq;
  } args{&acked_seq_, &ack_dead_, seq};
  if (!ack_mu_.AwaitWithTimeout(
          absl::Condition(
              +[](Args* a) { return *a->acked >= a->seq || *a->dead; }, &args),
          kWindowAckTimeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("no ACK for window ", push.key, " on NIC ", nic_.index()));
  }
  if (acked_seq_ < seq) {
    return absl::UnavailableError("control connection closed before the ACK");
  }
  return absl::OkStatus();
}

void ControlLink::PushWindowRemove(WindowKey key) {
  absl::Status sent;
  {
    absl::MutexLock lock(&send_mu_);
    sent = SendFrame(wire::EncodeWindowRemove({.key = key, .seq = next_seq_++}));
  }
  if (!sent.ok()) Close(sent);
}

}  // namespace fuselink::fabric::verbs
