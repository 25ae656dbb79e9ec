// One TCP connection of the fabric, in one of two roles:
//  - outbound (we connected, we sent HELLO): a tx thread drains a bounded ring of
//    posted writes onto the socket, header and payload in one sendmsg straight from
//    the registered source memory; an rx thread reads ACKs and completes the writes
//    in order.
//  - inbound (we accepted): one rx thread authenticates the connector (HELLO,
//    CHALLENGE, PROOF: tcp/handshake.h) and only then reads WRITEs; it admits each
//    write through the window it names (the peer's own, the extent inside it) before
//    a byte is placed, places the payload straight into the window's region, reports
//    the arrival and sends the ACK itself (it is the only writer of an inbound
//    socket, so it needs no tx thread). A refused write's payload is read and
//    dropped, its ACK carries the refusal, and the connection goes on.
//
// Lifecycle: constructed with a connected socket, Start()ed, then Close()d by
// anyone or by its own threads on any error. Its last thread to exit tells the host
// (OnConnectionFinished); the host then calls JoinAndFailPending() from another
// thread, which completes every write still in the ring with UNAVAILABLE, and
// destroys the connection. So each write completes exactly once: by its ACK on the
// rx thread, or by JoinAndFailPending after every thread is gone.
//
// Bounds (tcp/fabric.h): an inbound connection idles between frames as long as it
// likes, but no byte of a begun frame for the host's stall_timeout_ms (or an ACK that
// finds no room as long) closes it, DEADLINE_EXCEEDED with reason FABRIC_STALL; its
// rx thread wakes every quarter of that to judge. An outbound connection with writes
// on the wire closes when no ACK came for ack_timeout_ms, DEADLINE_EXCEEDED with
// reason FABRIC_ACK_TIMEOUT, and so do its siblings (ConnectionHost::OnAckTimeout);
// its rx thread wakes every eighth of that. Either close is counted on the NIC
// (stalled_connections, ack_timeouts: once per bound that fired).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/errors.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/fabric_keys.h"
#include "agent/fabric/region_table.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/window_table.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric {

// How long an accepted connection may take to prove itself (HELLO to PROOF), and a
// connector to get its CHALLENGE.
inline constexpr int kHelloTimeoutMs = 10'000;
// The reasons a connection closed by a bound carries.
inline constexpr Reason kStallReason = reasons::kFabricStall;
inline constexpr Reason kAckTimeoutReason = reasons::kFabricAckTimeout;
// How many times per ACK timeout a waiting rx thread wakes to judge it: the close
// comes at most timeout / ticks late (the stall bound's: kStallTicks, socket.h).
inline constexpr int kAckTicks = 8;

// Counters and the write budget of one NIC, shared by its connections.
struct NicStats {
  std::atomic<uint64_t> transmitted_bytes{0};
  std::atomic<uint64_t> received_bytes{0};
  // As NicCounters: delivered and refused writes alike.
  std::atomic<uint64_t> wire_tx_bytes{0};
  std::atomic<uint64_t> wire_rx_bytes{0};
  std::atomic<uint64_t> malformed_frames{0};
  // Writes this NIC received and refused: no window, another peer's, outside it.
  std::atomic<uint64_t> refused_writes{0};
  // Accepted connections closed before they proved a key: unknown name, wrong
  // PROOF, malformed or missing frames, timeouts.
  std::atomic<uint64_t> auth_failures{0};
  // As NicCounters.
  std::atomic<uint64_t> stalled_connections{0};
  std::atomic<uint64_t> ack_timeouts{0};
  std::atomic<uint64_t> peer_connection_refusals{0};
  // Writes posted on the NIC and not yet completed; at most queue_depth_per_nic.
  std::atomic<int> outstanding_writes{0};
};

// What a connection needs from its fabric. Outlives every connection.
class ConnectionHost {
 public:
  virtual ~ConnectionHost() = default;
  virtual Handler& handler() = 0;
  virtual NicStats& nic_stats(int nic) = 0;
  virtual const RegionTable& regions() const = 0;
  virtual const WindowTable& windows() const = 0;
  virtual uint32_t max_write_bytes() const = 0;
  // TcpFabricOptions' bounds.
  virtual int stall_timeout_ms() const = 0;
  virtual int ack_timeout_ms() const = 0;
  // Null when GPU regions cannot be registered.
  virtual DeviceStager* device_stager() = 0;
  // This node's name and keys, for the handshake of an inbound connection.
  virtual absl::string_view node_name() const = 0;
  virtual const FabricKeys& keys() const = 0;
  // Whether a connection that says HELLO as `name` may go on to its CHALLENGE: OK, or
  // RESOURCE_EXHAUSTED (reason FABRIC_PEER_CONNECTIONS) when that peer holds its share
  // of connections already. Counts the refusal on `nic`.
  virtual absl::Status AdmitHello(int nic, absl::string_view name) = 0;
  // An inbound connection proved it speaks for `name`: the peer it now belongs to.
  // RESOURCE_EXHAUSTED (reason FABRIC_PEER_CONNECTIONS, counted) when the peer holds
  // its share of connections already.
  virtual absl::StatusOr<PeerId> AttachInbound(uint64_t connection_id,
                                               absl::string_view name) = 0;
  // An outbound connection closes on the ACK bound with `why`: the host closes its
  // siblings (the same peer, the same NIC: the same path to the same process) with
  // it, so that its writes, going again, do not wait out the bound on each in turn.
  virtual void OnAckTimeout(uint64_t connection_id, const absl::Status& why) = 0;
  // The connection's last thread is exiting; called once, from that thread.
  virtual void OnConnectionFinished(uint64_t connection_id) = 0;
};

// A posted write; holds its source region alive until it completes.
struct PendingWrite {
  WriteOp op;
  std::shared_ptr<const Region> source;  // null for a notification
};

class TcpConnection {
 public:
  enum class Role { kOutbound, kInbound };

  // `queue_capacity` bounds the writes queued or in flight on this connection
  // (outbound only); the ring is allocated here, once.
  TcpConnection(ConnectionHost& host, uint64_t id, int nic, Role role, UniqueFd fd,
                int queue_capacity);
  // Closes and joins if the host has not; the socket closes last.
  ~TcpConnection();
  TcpConnection(const TcpConnection&) = delete;
  TcpConnection& operator=(const TcpConnection&) = delete;

  uint64_t id() const { return id_; }
  int nic() const { return nic_; }
  Role role() const { return role_; }

  // Starts the threads. Call once.
  void Start();
  // Queues a write (outbound only). Never blocks. UNAVAILABLE once closed,
  // RESOURCE_EXHAUSTED when the ring is full.
  absl::Status Enqueue(PendingWrite write);
  // Stops the connection: the first reason is kept, the socket is shut down so that
  // both threads wake. Thread-safe, idempotent; calls no handler.
  void Close(const absl::Status& why);
  // Joins the threads, then completes every write left with UNAVAILABLE. Only after
  // OnConnectionFinished; never from the connection's own threads.
  void JoinAndFailPending();

  bool closed() const;
  // Why the connection closed; OK while open.
  absl::Status close_reason() const;
  // Writes queued or awaiting their ACK; a hint, read without the lock.
  int queued() const { return queued_.load(std::memory_order_relaxed); }

 private:
  // Thread bodies; each returns why it stopped.
  absl::Status SendWrites();
  absl::Status ReceiveAcks();
  absl::Status ServeInbound();
  // Runs the acceptor's handshake and attaches the connection to its peer.
  absl::Status Authenticate();
  // Reads and drops `bytes` of payload: a refused write's.
  absl::Status Discard(uint32_t bytes);
  // Inbound: receives `bytes` of a frame; DEADLINE_EXCEEDED (reason FABRIC_STALL,
  // counted) when no byte came for the stall timeout, unless the frame has not
  // begun (`frame_begun` false and nothing received yet): an idle connection.
  absl::Status ReceiveFrame(void* data, size_t bytes, bool frame_begun);
  // Inbound: sends an ACK; FABRIC_STALL when the peer takes no byte of it in time.
  absl::Status SendAck(wire::HeaderBytes ack);
  // Outbound, on a quiet tick of the rx thread: DEADLINE_EXCEEDED (reason
  // FABRIC_ACK_TIMEOUT, counted) when writes are on the wire and none was
  // acknowledged for the ack timeout.
  absl::Status CheckAckOverdue();
  void RunThread(const char* name, absl::Status (TcpConnection::*body)());

  // The payload of a write from or into a GPU region, piece by piece through this
  // thread's stage (made on first use), overlapping the copies with the socket.
  absl::Status SendFromDevice(const std::shared_ptr<const Region>& source,
                              uint64_t offset, uint32_t bytes);
  absl::Status ReceiveIntoDevice(const std::shared_ptr<const Region>& target,
                                 uint64_t offset, uint32_t bytes);
  absl::StatusOr<DeviceStage*> Stage(std::unique_ptr<DeviceStage>& stage);

  // Counts a malformed frame on the NIC and returns the reason to close.
  absl::Status Malformed(const absl::Status& why);
  // Returns the write's NIC slot, then reports it to the handler.
  void Complete(const PendingWrite& write, absl::Status status,
                Refusal refusal = Refusal::kNone);
  // The target's answer: placed (kNone) or refused.
  void Complete(const PendingWrite& write, Refusal refusal);
  bool HasWorkOrClosed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ConnectionHost& host_;
  const uint64_t id_;
  const int nic_;
  const Role role_;
  PeerId peer_ = 0;        // inbound: set by its rx thread once the PROOF checks
  std::string peer_name_;  // inbound: the proven name; read by the rx thread only

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status close_reason_ ABSL_GUARDED_BY(mu_);
  // Ring of outbound writes: [head_, sent_) are on the wire awaiting their ACK,
  // [sent_, tail_) wait for the tx thread. Indices grow; slot = index % size.
  std::vector<PendingWrite> ring_ ABSL_GUARDED_BY(mu_);
  uint64_t head_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tail_ ABSL_GUARDED_BY(mu_) = 0;
  // When the oldest write on the wire started waiting for its ACK: when it was taken
  // to send while none was in flight (restarted after its fence), or when the ACK
  // before it came.
  absl::Time awaiting_ack_since_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> queued_{0};  // tail_ - head_, for PostWrite's choice
  // One per thread that moves GPU bytes: outbound tx, inbound rx.
  std::unique_ptr<DeviceStage> send_stage_;
  std::unique_ptr<DeviceStage> receive_stage_;

  // Declared before the threads: members die in reverse order, so the socket
  // outlives them (the destructor has joined them by then anyway).
  UniqueFd fd_;
  std::atomic<int> running_threads_{0};
  std::vector<std::thread> threads_;
};

}  // namespace fuselink::fabric
