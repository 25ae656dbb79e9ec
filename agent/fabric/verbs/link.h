// One control connection of the verbs fabric: a TCP connection per (peer, NIC) that
// exchanges QP information once and then carries windows, refusals and QP renewals
// between the two ends. No data ever travels on it (frames: verbs/wire.h).
//
// Why a TCP side channel and not the gRPC bootstrap: Fabric::Connect takes only the
// peer's Endpoints, and RC set-up needs a request/response (QPN, PSN, GID, MTU both
// ways) per NIC pair before either side may send; keeping it inside the fabric keeps
// the Fabric interface unchanged and the agent's bootstrap transport-neutral. The
// Endpoint a NIC advertises is this listener, exactly as for the TCP fabric.
//
// Windows: a WindowKey names a window on the target, but a source needs one rkey per
// extent per NIC to post an RDMA WRITE. The target pushes them to the window's peer
// only: each inbound link of that peer gets the peer's open windows in the handshake
// (before READY), then a WINDOW_ADD for every later OpenWindow, which returns only once
// every connected link of that peer has ACKed it (kWindowAckTimeout, then that link is
// closed) — so a key handed out through the bootstrap resolves at the source.
// WINDOW_REMOVE is not waited for: the registrations are gone by then and the target's
// NIC refuses a late write; the REMOVE only spares the source a QP renewal.
//
// Refusals the source decides not to post (no registration holds the write): the
// link asks the target (QUERY) and completes the write with the target's VERDICT, so a
// caller sees the same refusal as over TCP (closed, another peer's, outside). At most
// kMaxPendingQueries are in flight per link; they complete UNAVAILABLE if the link
// ends first.
//
// Authentication (handshake.h): before the target makes a QP or reveals a window for
// a source, the source proves the fabric key the target made for the name in its
// HELLO, and the target proves it back (CHALLENGE, PROOF). A link that does not is
// closed and counted (Nic::auth_failures).
// A proven source past its share of accepted links (LinkHost::AdmitInbound) is refused
// (REFUSE saying why) before it gets a QP, and counted (Nic::peer_link_refusals).
//
// Bounds after the handshake, both ends: a link may idle between frames as long as it
// likes, but once a frame's first byte has come, the rest of it (a WINDOW_ADD's
// records too) must keep coming: no byte for LinkHost::stall_timeout_ms closes the
// link, DEADLINE_EXCEEDED with reason FABRIC_STALL, counted (Nic::stalled_links), as
// a TCP fabric connection (RecvAllUnlessStalled, socket.h). A send that the peer takes
// no byte of for kControlSendTimeoutMs closes it too.
//
// QP renewal after a refusal (verbs/nic.h): the source resets its QP and sends
// QP_RENEW {index, QPN, new PSN}; the target replaces its QP of that index with a new
// one connected to it and answers QP_RENEWED; the source connects and posts its held
// writes again.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/unique_fd.h"
#include "agent/fabric/fabric_keys.h"
#include "agent/fabric/verbs/nic.h"
#include "agent/fabric/verbs/window.h"
#include "agent/fabric/verbs/wire.h"

namespace fuselink::fabric::verbs {

// How long a handshake may take, how long OpenWindow waits for a source's ACK before
// it gives up on that link (and closes it), and how long one send of a frame may block
// on a peer that stopped reading (then the link is closed).
inline constexpr int kHandshakeTimeoutMs = 10'000;
inline constexpr absl::Duration kWindowAckTimeout = absl::Seconds(10);
inline constexpr int kControlSendTimeoutMs = 10'000;
// Writes one link may have waiting for the target's VERDICT.
inline constexpr size_t kMaxPendingQueries = 64;

// One window of a peer as the link's NIC registered it.
struct WindowPush {
  WindowKey key = 0;
  uint64_t iova_base = 0;
  std::vector<wire::WindowRecord> records;
};

// What a link needs from its fabric.
class LinkHost {
 public:
  virtual ~LinkHost() = default;
  virtual Handler& handler() = 0;
  // This node's name and keys, for the handshake of an inbound link.
  virtual absl::string_view node_name() const = 0;
  virtual const FabricKeys& keys() const = 0;
  // VerbsFabricOptions::stall_timeout_ms: once a frame has begun, the longest the peer
  // may send no byte of it.
  virtual int stall_timeout_ms() const = 0;
  // An inbound link proved it speaks for `name`: OK, or RESOURCE_EXHAUSTED (reason
  // FABRIC_PEER_CONNECTIONS, counted) when that peer holds its share of accepted
  // links already. Before the link makes a QP.
  virtual absl::Status AdmitInbound(uint64_t link, absl::string_view name) = 0;
  // An inbound link proved it speaks for `name` and finished its handshake: attach it
  // (and activate its QPs) to the peer of that name. Returns the peer; fails as
  // AdmitInbound (checked again: two links of a peer may pass it together).
  virtual absl::StatusOr<PeerId> AttachInbound(uint64_t link, absl::string_view name) = 0;
  // The open windows of the link's peer on its NIC; from now on the link receives
  // every WINDOW_ADD of that peer. Called with the link's send lock held.
  virtual std::vector<WindowPush> StartPushing(uint64_t link) = 0;
  // What the target's windows say of a write from `peer` (kNone: it would land).
  virtual Refusal Judge(WindowKey key, absl::string_view peer, uint64_t offset,
                        uint64_t bytes) = 0;
  // Runs `task` on the fabric's worker thread.
  virtual void RunOnWorker(absl::AnyInvocable<void() &&> task) = 0;
  // The link's thread is exiting (or was never started); called once.
  virtual void OnLinkFinished(uint64_t link) = 0;
};

class ControlLink : public std::enable_shared_from_this<ControlLink> {
 public:
  enum class Role { kOutbound, kInbound };

  ControlLink(LinkHost& host, Nic& nic, uint64_t id, Role role, UniqueFd fd);
  ~ControlLink();
  ControlLink(const ControlLink&) = delete;
  ControlLink& operator=(const ControlLink&) = delete;

  uint64_t id() const { return id_; }
  Role role() const { return role_; }
  Nic& nic() const { return nic_; }
  // Why the link closed (OK while open).
  absl::Status close_reason() const;
  bool closed() const;

  // Outbound, on the caller's thread: creates `qp_count` QPs, says HELLO as
  // `node_name`, checks that the target proves `key` (our connect key for
  // `peer_name`) and proves it back, connects the QPs to the reply and reads the
  // windows up to READY. On failure the caller Close()s the link, which tears the QPs
  // down. UNAVAILABLE with reason FABRIC_AUTH when the target does not prove the key.
  absl::Status Handshake(absl::string_view node_name, absl::string_view peer_name,
                         const SessionKey& key, uint32_t qp_count);
  // Starts the link's thread: outbound, it applies pushed window frames and ACKs them,
  // completes queried writes and renewed QPs; inbound, it runs the handshake, then
  // reads ACKs, answers queries and renews QPs.
  void Start();
  // Shuts the socket down and starts the QPs' teardown. Idempotent, any thread.
  void Close(const absl::Status& why);
  void Join();

  // The QPs by index (an inbound link replaces one when it is renewed; null once
  // drained). Read without a lock only by the fabric under its own lock, after the
  // handshake.
  const std::vector<VerbsQp*>& qps() const { return qps_; }
  // Round-robin over the QPs that take writes now, else one being renewed (its writes
  // wait in its ring); null when none does. The fabric calls it, and Forget, under its
  // own lock, so a QP cannot be freed while chosen.
  VerbsQp* NextQp();
  // The QP is drained and about to be freed.
  void Forget(VerbsQp* qp);

  // Source side. The target extent holding the write, if any.
  std::optional<RemoteTarget> Resolve(WindowKey key, uint64_t offset,
                                      uint64_t bytes) const {
    return remote_windows_.Resolve(key, offset, bytes);
  }
  // A write Resolve could not place: asks the target why it refuses it; the write
  // completes with the answer (on the link's thread). RESOURCE_EXHAUSTED when
  // kMaxPendingQueries are pending, UNAVAILABLE when the link is closed.
  absl::Status AskTarget(const WriteOp& op);
  // On the worker: renews `qp` after a refusal (RestartQp, QP_RENEW). The answer
  // (ResumeQp) comes on the link's thread.
  void Renew(std::shared_ptr<VerbsQp> qp);

  // Target side: sends a WINDOW_ADD and waits for its ACK; sends a WINDOW_REMOVE.
  absl::Status PushWindow(const WindowPush& push);
  void PushWindowRemove(WindowKey key);
  // The peer an inbound link belongs to (empty before its HELLO).
  std::string peer_name() const;

 private:
  struct PendingQuery {
    bool used = false;
    bool sent = false;
    uint64_t seq = 0;
    WindowKey key = 0;
    uint64_t offset = 0;
    uint64_t wr_id = 0;
    uint32_t bytes = 0;
  };

  absl::Status ServeOutbound();
  absl::Status ServeInbound();
  absl::Status AcceptHandshake();
  // The first half of AcceptHandshake: HELLO, CHALLENGE, PROOF. Returns the proven
  // name; the QP records of the HELLO land in `records`.
  absl::StatusOr<std::string> Authenticate(std::vector<uint8_t>& records);
  // Creates the handshake's QPs into qps_, each still held (busy: a close is deferred,
  // the poller neither destroys nor frees it) so that LocalHello and ConnectQps may use
  // them; the handshake calls ReleaseQps once, however it ends.
  absl::Status CreateQps(uint32_t count);
  void ReleaseQps();
  absl::Status ConnectQps(const wire::HelloHeader& hello,
                          const std::vector<wire::QpInfo>& infos);
  absl::Status SendFrame(const wire::Frame& frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);
  // How a frame's bytes are read: in the outbound handshake, each receive within the
  // socket's timeout (kHandshakeTimeoutMs); serving, idle as long as the peer likes
  // before a frame begins, then no stall (RecvAllUnlessStalled; a stall is counted).
  enum class Reading { kHandshake, kServing };
  absl::Status Receive(void* data, size_t bytes, Reading reading, bool begun);
  absl::StatusOr<wire::Decoded> ReadFrame(Reading reading);
  absl::StatusOr<wire::Decoded> ReadFrameBefore(absl::Time deadline);
  // Reads a WINDOW_ADD's records (its header read just before) and applies them.
  absl::Status ApplyWindowAdd(const wire::WindowAdd& add, Reading reading);
  absl::Status ApplyVerdict(const wire::Verdict& verdict);
  absl::Status RenewInbound(const wire::QpRenew& renew);
  void SendQuery(uint64_t seq);
  void FailQueries(const absl::Status& why);
  wire::Hello LocalHello(std::string name) const;

  LinkHost& host_;
  Nic& nic_;
  const uint64_t id_;
  const Role role_;
  UniqueFd fd_;
  std::vector<VerbsQp*> qps_;  // see qps(); replaced entries under close_mu_
  std::atomic<uint32_t> next_qp_{0};

  // Inbound: set by the handshake, before the link's QPs take arrivals.
  PeerId peer_ = 0;
  std::string peer_name_ ABSL_GUARDED_BY(close_mu_);
  std::shared_ptr<PeerDomain> domain_;
  wire::HelloHeader remote_hello_;  // the peer's GID and MTU, for renewed QPs

  mutable absl::Mutex close_mu_;
  absl::Status close_reason_ ABSL_GUARDED_BY(close_mu_);
  bool closed_ ABSL_GUARDED_BY(close_mu_) = false;

  absl::Mutex send_mu_;  // one writer of the socket at a time
  uint64_t next_seq_ ABSL_GUARDED_BY(send_mu_) = 1;

  mutable absl::Mutex ack_mu_;
  uint64_t acked_seq_ ABSL_GUARDED_BY(ack_mu_) = 0;
  bool ack_dead_ ABSL_GUARDED_BY(ack_mu_) = false;  // no ACK will come any more

  RemoteWindowTable remote_windows_;  // outbound

  absl::Mutex queries_mu_;
  std::array<PendingQuery, kMaxPendingQueries> queries_ ABSL_GUARDED_BY(queries_mu_);
  uint64_t next_query_seq_ ABSL_GUARDED_BY(queries_mu_) = 1;
  bool queries_closed_ ABSL_GUARDED_BY(queries_mu_) = false;

  absl::Mutex renew_mu_;
  // Outbound: QPs waiting for QP_RENEWED, by index.
  std::vector<std::shared_ptr<VerbsQp>> renewing_ ABSL_GUARDED_BY(renew_mu_);

  std::thread thread_;
};

}  // namespace fuselink::fabric::verbs
