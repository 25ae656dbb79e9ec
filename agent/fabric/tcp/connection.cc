#include "agent/fabric/tcp/connection.h"

#include <sys/socket.h>

#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/tcp/handshake.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric {

TcpConnection::TcpConnection(ConnectionHost& host, uint64_t id, int nic, Role role,
                             UniqueFd fd, int queue_capacity)
    : host_(host),
      id_(id),
      nic_(nic),
      role_(role),
      ring_(role == Role::kOutbound ? static_cast<size_t>(queue_capacity) : 0),
      fd_(std::move(fd)) {}

TcpConnection::~TcpConnection() {
  Close(absl::UnavailableError("connection destroyed"));
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

void TcpConnection::Start() {
  if (role_ == Role::kOutbound) {
    running_threads_.store(2);
    threads_.emplace_back(&TcpConnection::RunThread, this, "fl-tcp-tx",
                          &TcpConnection::SendWrites);
    threads_.emplace_back(&TcpConnection::RunThread, this, "fl-tcp-rx",
                          &TcpConnection::ReceiveAcks);
  } else {
    running_threads_.store(1);
    threads_.emplace_back(&TcpConnection::RunThread, this, "fl-tcp-in",
                          &TcpConnection::ServeInbound);
  }
}

void TcpConnection::RunThread(const char* name, absl::Status (TcpConnection::*body)()) {
  NameThisThread(name);
  SetThreadRole(ThreadRole::kFabric);  // blocks on its own socket only
  Close((this->*body)());
  if (running_threads_.fetch_sub(1) == 1) host_.OnConnectionFinished(id_);
}

absl::Status TcpConnection::Enqueue(PendingWrite write) {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    return absl::UnavailableError(
        absl::StrCat("connection closed: ", close_reason_.message()));
  }
  if (tail_ - head_ == ring_.size()) {
    return absl::ResourceExhaustedError("connection queue full");
  }
  ring_[tail_ % ring_.size()] = std::move(write);
  ++tail_;
  queued_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

void TcpConnection::Close(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    close_reason_ = why.ok() ? absl::UnavailableError("connection closed") : why;
  }
  // Wakes a blocked send or recv on either thread; the descriptor stays open until
  // destruction, so no thread can see it reused. ENOTCONN (never connected, already
  // reset) leaves nothing to do.
  shutdown(fd_.get(), SHUT_RDWR);
}

void TcpConnection::JoinAndFailPending() {
  FL_CHECK(CurrentThreadRole() != ThreadRole::kFabric,
           "a connection is joined from one of the fabric's own threads");
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  std::vector<PendingWrite> failed;
  absl::Status why;
  {
    absl::MutexLock lock(&mu_);
    why = close_reason_;
    failed.reserve(tail_ - head_);
    for (; head_ != tail_; ++head_) {
      failed.push_back(std::move(ring_[head_ % ring_.size()]));
    }
    sent_ = head_;
    queued_.store(0, std::memory_order_relaxed);
  }
  // UNAVAILABLE whatever closed it (the write may go again on another connection),
  // with the close's reason (FABRIC_ACK_TIMEOUT, ...) kept for the caller to see.
  const absl::Status lost = WithPayloadsOf(
      absl::UnavailableError(absl::StrCat("connection lost: ", why.message())), why);
  for (const PendingWrite& write : failed) Complete(write, lost);
}

bool TcpConnection::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

absl::Status TcpConnection::close_reason() const {
  absl::MutexLock lock(&mu_);
  return close_reason_;
}

bool TcpConnection::HasWorkOrClosed() const { return closed_ || sent_ != tail_; }

absl::Status TcpConnection::Malformed(const absl::Status& why) {
  host_.nic_stats(nic_).malformed_frames.fetch_add(1, std::memory_order_relaxed);
  return absl::InvalidArgumentError(
      absl::StrCat("closed on a malformed frame: ", why.message()));
}

void TcpConnection::Complete(const PendingWrite& write, Refusal refusal) {
  Complete(write, RefusalStatus(refusal), refusal);
}

void TcpConnection::Complete(const PendingWrite& write, absl::Status status,
                             Refusal refusal) {
  NicStats& stats = host_.nic_stats(nic_);
  // The slot is free before the handler runs, so that it may post again.
  stats.outstanding_writes.fetch_sub(1, std::memory_order_acq_rel);
  if (status.ok()) {
    stats.transmitted_bytes.fetch_add(write.op.bytes, std::memory_order_relaxed);
  }
  // A refusal is the target's answer to a write it read in full: its bytes crossed.
  if (status.ok() || refusal != Refusal::kNone) {
    stats.wire_tx_bytes.fetch_add(write.op.bytes, std::memory_order_relaxed);
  }
  host_.handler().OnCompletion(Completion{.wr_id = write.op.wr_id,
                                          .nic = nic_,
                                          .bytes = write.op.bytes,
                                          .status = std::move(status),
                                          .refusal = refusal});
}

absl::Status TcpConnection::SendWrites() {
  while (true) {
    PendingWrite next;  // a copy: the ring slot may be completed while we send
    {
      absl::MutexLock lock(&mu_, absl::Condition(this, &TcpConnection::HasWorkOrClosed));
      if (closed_) return absl::OkStatus();
      next = ring_[sent_ % ring_.size()];
      if (head_ == sent_) awaiting_ack_since_ = absl::Now();
      ++sent_;
    }
    const WriteOp& op = next.op;
    // A device fault here leaves the source unreadable: the connection closes and
    // its writes fail over to other NICs.
    if (op.after != nullptr) {
      FL_RETURN_IF_ERROR(op.after->Wait());
      // The fence is the producer's time, not the target's: the ACK clock of the
      // oldest write starts once it can go.
      absl::MutexLock lock(&mu_);
      if (head_ + 1 == sent_) awaiting_ack_since_ = absl::Now();
    }
    wire::HeaderBytes header =
        wire::EncodeWrite(wire::WriteHeader{.key = op.remote_key,
                                            .offset = op.remote_offset,
                                            .bytes = op.bytes,
                                            .imm = op.imm,
                                            .wr_id = op.wr_id});
    iovec iov[2] = {{header.data(), header.size()}, {nullptr, 0}};
    size_t iov_count = 1;
    const bool staged = op.bytes > 0 && next.source->on_gpu();
    if (op.bytes > 0 && !staged) {
      iov[1] = {next.source->base + op.local_offset, op.bytes};
      iov_count = 2;
    }
    FL_RETURN_IF_ERROR(SendAll(fd_.get(), std::span<iovec>(iov, iov_count)));
    if (staged) {
      FL_RETURN_IF_ERROR(SendFromDevice(next.source, op.local_offset, op.bytes));
    }
  }
}

absl::StatusOr<DeviceStage*> TcpConnection::Stage(std::unique_ptr<DeviceStage>& stage) {
  if (stage == nullptr) {
    DeviceStager* stager = host_.device_stager();
    if (stager == nullptr) return absl::FailedPreconditionError("no device stager");
    FL_ASSIGN_OR_RETURN(stage, stager->NewStage(nic_));
  }
  return stage.get();
}

// Piece i is copied into buffer i % 2 while piece i - 1 is on the socket. A copy that
// timed out may still read `source`: the stage keeps it.
absl::Status TcpConnection::SendFromDevice(const std::shared_ptr<const Region>& source,
                                           uint64_t offset, uint32_t bytes) {
  FL_ASSIGN_OR_RETURN(DeviceStage * stage, Stage(send_stage_));
  const uint32_t piece = stage->piece_bytes();
  const uint64_t base = reinterpret_cast<uintptr_t>(source->base) + offset;
  FL_RETURN_IF_ERROR(stage->StartToHost(source->gpu, base, 0, std::min(piece, bytes)));
  for (uint32_t at = 0, i = 0; at < bytes; at += piece, ++i) {
    const uint32_t n = std::min(piece, bytes - at);
    FL_RETURN_IF_ERROR(KeepOnTimeout(*stage, source, stage->Wait()));
    if (at + n < bytes) {
      FL_RETURN_IF_ERROR(stage->StartToHost(source->gpu, base + at + n, (i + 1) % 2,
                                            std::min(piece, bytes - at - n)));
    }
    iovec iov[1] = {{stage->buffer(i % 2), n}};
    FL_RETURN_IF_ERROR(SendAll(fd_.get(), iov));
  }
  return absl::OkStatus();
}

// Piece i arrives in buffer i % 2 while piece i - 1 is copied to the GPU. A copy that
// timed out may still write `target`: the stage keeps it.
absl::Status TcpConnection::ReceiveIntoDevice(const std::shared_ptr<const Region>& target,
                                              uint64_t offset, uint32_t bytes) {
  FL_ASSIGN_OR_RETURN(DeviceStage * stage, Stage(receive_stage_));
  const uint32_t piece = stage->piece_bytes();
  const uint64_t base = reinterpret_cast<uintptr_t>(target->base) + offset;
  for (uint32_t at = 0, i = 0; at < bytes; at += piece, ++i) {
    const uint32_t n = std::min(piece, bytes - at);
    FL_RETURN_IF_ERROR(ReceiveFrame(stage->buffer(i % 2), n, /*frame_begun=*/true));
    FL_RETURN_IF_ERROR(KeepOnTimeout(*stage, target, stage->Wait()));
    FL_RETURN_IF_ERROR(stage->StartToDevice(target->gpu, base + at, i % 2, n));
  }
  return KeepOnTimeout(*stage, target, stage->Wait());
}

absl::Status TcpConnection::CheckAckOverdue() {
  const int timeout_ms = host_.ack_timeout_ms();
  uint64_t on_wire;
  {
    absl::MutexLock lock(&mu_);
    on_wire = sent_ - head_;
    if (on_wire == 0 ||
        absl::Now() - awaiting_ack_since_ < absl::Milliseconds(timeout_ms)) {
      return absl::OkStatus();
    }
  }
  host_.nic_stats(nic_).ack_timeouts.fetch_add(1, std::memory_order_relaxed);
  absl::Status why = WithReason(
      absl::DeadlineExceededError(absl::StrCat("no ACK for ", timeout_ms, " ms with ",
                                               on_wire, " writes on the wire (NIC ", nic_,
                                               "): the target stopped answering")),
      kAckTimeoutReason);
  host_.OnAckTimeout(id_, why);
  return why;
}

absl::Status TcpConnection::ReceiveAcks() {
  const uint32_t max_write_bytes = host_.max_write_bytes();
  FL_RETURN_IF_ERROR(
      SetReceiveTimeout(fd_.get(), TickMs(host_.ack_timeout_ms(), kAckTicks)));
  while (true) {
    wire::HeaderBytes header;
    FL_RETURN_IF_ERROR(RecvAllOr(fd_.get(), header.data(), header.size(),
                                 [this](size_t) { return CheckAckOverdue(); }));
    absl::StatusOr<wire::Header> decoded = wire::DecodeHeader(header, max_write_bytes);
    if (!decoded.ok()) return Malformed(decoded.status());
    // The acceptor took our PROOF, then found our share full (tcp/handshake.h).
    if (const auto* refuse = std::get_if<wire::RefuseHeader>(&*decoded)) {
      return RefusedByAcceptor(refuse->why);
    }
    const auto* ack = std::get_if<wire::AckFrame>(&*decoded);
    if (ack == nullptr) return Malformed(absl::InvalidArgumentError("expected an ACK"));
    PendingWrite done;
    {
      absl::MutexLock lock(&mu_);
      if (head_ == sent_) {
        return Malformed(absl::InvalidArgumentError("ACK with no write in flight"));
      }
      PendingWrite& oldest = ring_[head_ % ring_.size()];
      if (oldest.op.wr_id != ack->wr_id) {
        return Malformed(absl::InvalidArgumentError(
            absl::StrCat("ACK for wr_id ", ack->wr_id, ", expected ", oldest.op.wr_id)));
      }
      done = std::move(oldest);
      ++head_;
      awaiting_ack_since_ = absl::Now();  // the next write's wait starts with this ACK
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    Complete(done, ack->refusal);
  }
}

absl::Status TcpConnection::Authenticate() {
  absl::StatusOr<std::string> name = AuthenticateConnector(
      fd_.get(), static_cast<uint32_t>(nic_), host_.node_name(), host_.keys(),
      host_.max_write_bytes(), kHelloTimeoutMs,
      [this](absl::string_view connector) { return host_.AdmitHello(nic_, connector); });
  if (!name.ok()) {
    // Closed by this side (the fabric going away): no failure of the connector's.
    // Refused for its peer's share: counted as such, not as a failed proof.
    if (closed() || ReasonOf(name.status()) == kPeerConnectionsReason) {
      return name.status();
    }
    NicStats& stats = host_.nic_stats(nic_);
    if (ReasonOf(name.status()) == kMalformedReason) {
      stats.malformed_frames.fetch_add(1, std::memory_order_relaxed);
    }
    stats.auth_failures.fetch_add(1, std::memory_order_relaxed);
    return name.status();
  }
  absl::StatusOr<PeerId> peer = host_.AttachInbound(id_, *name);
  if (!peer.ok()) return RefuseConnector(fd_.get(), peer.status());
  peer_ = *peer;
  peer_name_ = *std::move(name);
  return absl::OkStatus();
}

absl::Status TcpConnection::Discard(uint32_t bytes) {
  uint8_t sink[64 << 10];
  while (bytes > 0) {
    const uint32_t n = std::min<uint32_t>(bytes, sizeof(sink));
    FL_RETURN_IF_ERROR(ReceiveFrame(sink, n, /*frame_begun=*/true));
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status TcpConnection::ReceiveFrame(void* data, size_t bytes, bool frame_begun) {
  absl::Status received =
      RecvAllUnlessStalled(fd_.get(), data, bytes, host_.stall_timeout_ms(), frame_begun);
  if (ReasonOf(received) == kStallReason) {
    host_.nic_stats(nic_).stalled_connections.fetch_add(1, std::memory_order_relaxed);
  }
  return received;
}

absl::Status TcpConnection::SendAck(wire::HeaderBytes ack) {
  iovec iov[1] = {{ack.data(), ack.size()}};
  absl::Status sent = SendAll(fd_.get(), iov);
  if (sent.code() != absl::StatusCode::kDeadlineExceeded) return sent;
  host_.nic_stats(nic_).stalled_connections.fetch_add(1, std::memory_order_relaxed);
  return WithReason(
      absl::DeadlineExceededError(absl::StrCat("the peer took no byte of an ACK for ",
                                               host_.stall_timeout_ms(), " ms")),
      kStallReason);
}

absl::Status TcpConnection::ServeInbound() {
  FL_RETURN_IF_ERROR(Authenticate());
  NicStats& stats = host_.nic_stats(nic_);
  const uint32_t max_write_bytes = host_.max_write_bytes();
  FL_RETURN_IF_ERROR(
      SetReceiveTimeout(fd_.get(), TickMs(host_.stall_timeout_ms(), kStallTicks)));
  FL_RETURN_IF_ERROR(SetSendTimeout(fd_.get(), host_.stall_timeout_ms()));
  while (true) {
    wire::HeaderBytes header;
    FL_RETURN_IF_ERROR(ReceiveFrame(header.data(), header.size(), /*frame_begun=*/false));
    absl::StatusOr<wire::Header> decoded = wire::DecodeHeader(header, max_write_bytes);
    if (!decoded.ok()) return Malformed(decoded.status());
    const auto* write = std::get_if<wire::WriteHeader>(&*decoded);
    if (write == nullptr) {
      return Malformed(absl::InvalidArgumentError("expected a WRITE"));
    }
    Refusal refusal = Refusal::kNone;
    const Arrival arrival{.peer = peer_,
                          .peer_name = peer_name_,
                          .nic = nic_,
                          .window = write->bytes > 0 ? write->key : 0,
                          .offset = write->offset,
                          .bytes = write->bytes,
                          .imm = write->imm};
    if (write->bytes == 0) {
      host_.handler().OnArrival(arrival);  // a notification: nothing to place
    } else {
      // The placement rule: nothing lands unless the window is open, this peer's, and
      // holds the whole extent. The placement keeps the window draining until the
      // handler has seen the arrival.
      std::variant<WindowTable::Placement, Refusal> admitted =
          host_.windows().Admit(write->key, peer_name_, write->offset, write->bytes);
      if (auto* why = std::get_if<Refusal>(&admitted)) {
        refusal = *why;
        stats.refused_writes.fetch_add(1, std::memory_order_relaxed);
        FL_RETURN_IF_ERROR(Discard(write->bytes));
        stats.wire_rx_bytes.fetch_add(write->bytes, std::memory_order_relaxed);
      } else {
        const auto& placement = std::get<WindowTable::Placement>(admitted);
        const Region& target = placement.region();
        FL_CHECK(ExtentFits(write->offset, write->bytes, target.bytes),
                 "an admitted write outside its region");  // Admit and Open checked
        if (target.on_gpu()) {
          FL_RETURN_IF_ERROR(
              ReceiveIntoDevice(placement.shared_region(), write->offset, write->bytes));
        } else {
          FL_RETURN_IF_ERROR(ReceiveFrame(target.base + write->offset, write->bytes,
                                          /*frame_begun=*/true));
        }
        stats.received_bytes.fetch_add(write->bytes, std::memory_order_relaxed);
        stats.wire_rx_bytes.fetch_add(write->bytes, std::memory_order_relaxed);
        host_.handler().OnArrival(arrival);
      }
    }
    wire::HeaderBytes ack = wire::EncodeAck({.wr_id = write->wr_id,
                                             .code = RefusalStatus(refusal).code(),
                                             .refusal = refusal});
    FL_RETURN_IF_ERROR(SendAck(ack));
  }
}

}  // namespace fuselink::fabric
