// One NIC of the verbs fabric: its device context, protection domains, one completion
// queue shared by every QP on it, the receive-buffer arena, the QP table, and the
// thread that polls the CQ.
//
// Data path. A write is two work requests chained in one ibv_post_send on one RC QP:
//   1. IBV_WR_RDMA_WRITE, unsignaled: the payload, straight from the registered source
//      into one extent of a window the target opened for this node (remote address =
//      offset in the region, rkey = that extent's registration; verbs/window.h).
//      Omitted for a 0-byte write (a notification).
//   2. IBV_WR_SEND_WITH_IMM, signaled, inline: a 16-byte Descriptor {window, bytes,
//      offset} with the caller's immediate.
// Why not RDMA WRITE WITH IMMEDIATE alone: its receive completion carries only the
// immediate and the length, while Fabric's Arrival promises the window and offset,
// which the target checks against its open windows (a descriptor that disagrees is
// malformed). The SEND is inline (no DMA read, ~no cost next to a chunk) and RC orders
// it after the WRITE, so its receive completion on the target means the payload is in
// place, and its send completion on the source means the target has acknowledged both.
//
// Protection domains. QPs that send (the connecting side's) live in the NIC's PD with
// the local regions they read (lkeys only: no region is remotely writable). QPs that
// receive from peer P (the accepting side's) live in P's PeerDomain, where the target
// registers the extents of P's windows and nothing else: a write from P can reach only
// P's windows, a guessed rkey of another peer's window fails at the NIC (PD mismatch).
//
// Refusals. A write the target's NIC refuses (its window closed: the registration is
// gone) completes IBV_WC_REM_ACCESS_ERR: the caller sees Refusal::kNoWindow. RC then
// puts both ends of that QP into error, flushing the writes behind it — which were
// never executed at the target (the responder stops at the refused packet). The NIC
// keeps those writes in the ring, and once every WR of the QP is back the fabric
// renews the QP (RESET -> INIT -> RTR -> RTS with a new PSN, towards a new QP at the
// target: verbs/link.h, QP_RENEW) and the held writes are posted again, in order; the
// caller sees only the refusal. A renewal that fails or takes longer than
// kRenewTimeout closes the QP: the held writes complete UNAVAILABLE.
//
// CQE quota. Each QP keeps recv_depth receives posted: reserved when the QP takes a
// table slot, so at most max_qps * recv_depth receive CQEs. Each write reserves one
// unit of the NIC's send quota (queue_depth) in PostWrite and returns it when its SEND
// completes (a held write keeps its unit until it completes after all); a write makes
// at most two CQEs per posting (on error the unsignaled WRITE reports too, then the
// SEND flushes), and is posted again only once its earlier CQEs are polled. The CQ
// holds 2 * queue_depth + max_qps * recv_depth entries, so it can never overflow; a
// spent quota answers RESOURCE_EXHAUSTED.
//
// Teardown of a QP (two-phase): Close() moves it to ERR, the provider flushes every
// posted WR as IBV_WC_WR_FLUSH_ERR, the poller completes each write exactly once
// (UNAVAILABLE for flushes), and once no send or receive is outstanding the poller
// destroys the QP and tells the host (OnQpClosed). A write completes exactly once:
// from its SEND's completion, or from the WRITE's error completion with the SEND's
// later flush then only freeing the slot.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/limits.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/verbs/device.h"
#include "agent/fabric/verbs/worker.h"
#include "agent/fabric/verbs/wrap.h"
#include "agent/fabric/window_table.h"

namespace fuselink::fabric::verbs {

// Bounds, encoded in wr_id below (with kMaxWrDepth, agent/common/limits.h).
inline constexpr uint32_t kMaxQpsPerNic = 4096;

// Peers one NIC holds protection domains for (peers with inbound QPs or open windows).
inline constexpr size_t kMaxPeerDomainsPerNic = 4096;
// How long a QP may stay in renewal (after a refusal) before it is closed.
inline constexpr absl::Duration kRenewTimeout = absl::Seconds(10);
// Completions taken per ibv_poll_cq; a stack array.
inline constexpr int kPollBatch = 32;
// Idle polls before the poller starts sleeping, and its longest sleep: an idle NIC
// costs ~1/kMaxIdleSleepUs wakeups per microsecond, a busy one never sleeps.
inline constexpr int kIdleSpins = 256;
inline constexpr int kMaxIdleSleepUs = 200;

// The work-request id of every WR the fabric posts.
//   bits  0..15  slot: send-ring or receive-buffer index within the QP (< kMaxWrDepth)
//   bits 16..31  QP index in the NIC's table (< kMaxQpsPerNic)
//   bits 32..61  generation of that table slot, so a stale CQE is recognised
//   bit  62      the payload WRITE half of a write (reports only on error)
//   bit  63      a receive
namespace wr_id {
inline constexpr int kSlotBits = 16;
inline constexpr int kQpBits = 16;
inline constexpr int kGenerationBits = 30;
static_assert(kMaxWrDepth <= (1u << kSlotBits), "a ring slot fits in wr_id");
static_assert(kMaxQpsPerNic <= (1u << kQpBits), "a QP index fits in wr_id");
static_assert(kSlotBits + kQpBits + kGenerationBits + 2 == 64, "wr_id is 64 bits");
inline constexpr uint32_t kGenerationMask = (1u << kGenerationBits) - 1;

struct Fields {
  uint32_t slot = 0;
  uint32_t qp = 0;
  uint32_t generation = 0;
  bool payload = false;
  bool recv = false;
};
constexpr uint64_t Encode(const Fields& f) {
  return uint64_t{f.slot} | (uint64_t{f.qp} << kSlotBits) |
         (uint64_t{f.generation & kGenerationMask} << (kSlotBits + kQpBits)) |
         (uint64_t{f.payload} << 62) | (uint64_t{f.recv} << 63);
}
constexpr Fields Decode(uint64_t id) {
  return Fields{.slot = static_cast<uint32_t>(id & ((1u << kSlotBits) - 1)),
                .qp = static_cast<uint32_t>((id >> kSlotBits) & ((1u << kQpBits) - 1)),
                .generation = static_cast<uint32_t>((id >> (kSlotBits + kQpBits)) &
                                                    kGenerationMask),
                .payload = ((id >> 62) & 1) != 0,
                .recv = ((id >> 63) & 1) != 0};
}
}  // namespace wr_id

// What a write's SEND carries, inline.
struct Descriptor {
  WindowKey key = 0;  // 0 for a notification
  uint32_t bytes = 0;
  uint64_t offset = 0;
};
static_assert(sizeof(Descriptor) == 16, "the descriptor is 16 bytes on the wire");

// Sizes of one NIC's queues, fixed at start-up.
struct NicSizing {
  uint32_t max_qps = 64;
  uint32_t send_depth_per_qp = 128;  // writes in flight on one QP
  uint32_t recv_depth_per_qp = 256;  // receives kept posted on one QP
  uint32_t queue_depth = 512;        // writes in flight on the NIC (CQE quota)
  uint32_t max_write_bytes = 64 << 20;
  uint32_t max_window_registrations = 1 << 16;  // checked against max_mr
  // A QP with writes outstanding and none acknowledged for this long is closed (its
  // writes complete UNAVAILABLE): the watchdog over whatever the RC retries miss.
  absl::Duration ack_timeout = absl::Seconds(10);
};

// Where the source of a write lives on this NIC, and what keeps it alive.
struct WriteSource {
  uint64_t address = 0;
  uint32_t lkey = 0;
  std::shared_ptr<const void> hold;
};

// One peer's protection domain on one NIC: the accepting side's QPs from that peer,
// the registrations of that peer's windows, and the receive arena registered again
// for those QPs. Shared by them; the PD goes when the last one lets go. Member order
// is teardown order: the arena's MR before the PD.
class PeerDomain {
 public:
  PeerDomain(std::string peer, ProtectionDomain pd)
      : peer_(std::move(peer)), pd_(std::move(pd)) {}
  const std::string& peer() const { return peer_; }
  ibv_pd* pd() const { return pd_.get(); }
  uint32_t arena_lkey() const { return arena_->lkey; }

 private:
  friend class Nic;
  const std::string peer_;
  ProtectionDomain pd_;
  MemoryRegion arena_;
};

// A random 24-bit packet sequence number.
uint32_t RandomPsn();

// One RC QP and its send ring. Owned by its Nic's table; the fabric refers to it by
// pointer while it is in the table (until OnQpClosed), a renewal by shared_ptr.
class VerbsQp : public std::enable_shared_from_this<VerbsQp> {
 public:
  enum class State { kInit, kActive, kRenewing, kClosing };
  // Everything needed to post the write again after a renewal.
  struct SendSlot {
    uint64_t user_wr_id = 0;
    uint32_t bytes = 0;
    uint32_t imm = 0;
    uint64_t source_address = 0;
    uint32_t lkey = 0;
    uint32_t rkey = 0;
    uint64_t remote_address = 0;  // in the target extent's registration (iova)
    Descriptor descriptor;
    bool reported = false;             // its completion has been delivered
    bool held = false;                 // flushed behind a refusal: to be posted again
    std::shared_ptr<const void> hold;  // the source region, until the write completes
  };

  VerbsQp(uint32_t index, uint32_t generation, uint64_t link,
          std::shared_ptr<PeerDomain> domain, QueuePair qp, uint32_t send_depth)
      : index(index),
        generation(generation),
        link(link),
        domain(std::move(domain)),
        qp(std::move(qp)) {
    ring.resize(send_depth);
  }

  const uint32_t index;
  const uint32_t generation;
  const uint64_t link;
  // Null for a QP that sends (the NIC's PD). Declared before `qp`: outlives it.
  const std::shared_ptr<PeerDomain> domain;
  QueuePair qp;
  bool sends() const { return domain == nullptr; }

  mutable absl::Mutex mu;
  State state ABSL_GUARDED_BY(mu) = State::kInit;
  uint32_t local_psn ABSL_GUARDED_BY(mu) = RandomPsn();
  RemoteQp remote ABSL_GUARDED_BY(mu);  // as connected; a renewal keeps GID, LID and MTU
  PeerId peer ABSL_GUARDED_BY(mu) = 0;
  // Written once, by Activate, before the QP can take arrivals; then read-only.
  std::string peer_name ABSL_GUARDED_BY(mu);
  absl::Status close_reason ABSL_GUARDED_BY(mu);
  // The provider cannot flush (ToError failed): the poller fails what is left.
  bool force_drain ABSL_GUARDED_BY(mu) = false;
  bool finalized ABSL_GUARDED_BY(mu) = false;
  // [head, tail) are posted (or held) and not yet completed; slot = index % ring.size().
  std::vector<SendSlot> ring ABSL_GUARDED_BY(mu);
  uint64_t head ABSL_GUARDED_BY(mu) = 0;
  uint64_t tail ABSL_GUARDED_BY(mu) = 0;
  uint32_t posted_recvs ABSL_GUARDED_BY(mu) = 0;
  // Renewal. `holding`: a refusal put the QP into error; writes flushed behind it stay
  // in the ring (`held` of them so far) instead of completing.
  bool holding ABSL_GUARDED_BY(mu) = false;
  uint64_t held ABSL_GUARDED_BY(mu) = 0;
  WindowKey refused_window ABSL_GUARDED_BY(mu) = 0;  // its held writes are refused too
  bool renew_requested ABSL_GUARDED_BY(mu) = false;
  absl::Time renew_deadline ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
  // The last sign of life of the writes in [head, tail): the posting of the first
  // of them into an empty ring, or the latest acknowledgement. The ack watchdog
  // (ExpireStalledWrites) closes an active QP whose ring is non-empty past it.
  absl::Time progress_at ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  // A renewal step is using the ibv_qp outside the lock: nobody else may touch it (a
  // close is deferred to the step's end, the poller does not destroy it).
  bool busy ABSL_GUARDED_BY(mu) = false;
  bool error_deferred ABSL_GUARDED_BY(mu) = false;
};

// What a NIC needs from its fabric. Called on the poller thread unless noted.
class NicHost {
 public:
  virtual ~NicHost() = default;
  virtual Handler& handler() = 0;
  // Copies staged arrivals into GPU memory (the lander); null without GPU memory.
  virtual DeviceStager* device_stager() = 0;
  // An arrival's descriptor against the open windows (WindowTable::Admit); the
  // placement keeps the window draining while the handler sees the arrival.
  virtual std::variant<WindowTable::Placement, Refusal> Admit(WindowKey key,
                                                              absl::string_view peer,
                                                              uint64_t offset,
                                                              uint64_t bytes) const = 0;
  // A QP of `link` exists (before any of its CQEs can be polled). Any thread.
  virtual void OnQpCreated(uint64_t link) = 0;
  // A QP of `link` is drained: every one of its writes has completed. Its ibv_qp is
  // destroyed, and it leaves the table when this returns (the object goes then, or
  // when a renewal step holding it lets go); the host must forget the pointer here.
  virtual void OnQpClosed(uint64_t link, VerbsQp* qp, const absl::Status& why) = 0;
  // A QP of `link` hit a refusal and every WR of it is back: renew it (RestartQp, the
  // QP_RENEW exchange, ResumeQp) off this thread. `qp` keeps the object alive.
  virtual void OnQpRefused(uint64_t link, std::shared_ptr<VerbsQp> qp) = 0;
};

class Nic {
 public:
  static absl::StatusOr<std::unique_ptr<Nic>> Open(int index, NicBinding binding,
                                                   const NicSizing& sizing,
                                                   const RcParams& rc, NicHost& host);
  // Every QP must be closed and drained first (WaitUntilNoQps).
  ~Nic();
  Nic(const Nic&) = delete;
  Nic& operator=(const Nic&) = delete;

  int index() const { return index_; }
  const NicBinding& binding() const { return binding_; }
  // The NIC's own PD: local regions and the QPs that send.
  ibv_pd* pd() const { return pd_.get(); }
  ibv_mtu mtu() const { return binding_.port.active_mtu; }

  // The protection domain of `peer` on this NIC, made on first use. RESOURCE_EXHAUSTED
  // past kMaxPeerDomainsPerNic live domains. Any thread.
  absl::StatusOr<std::shared_ptr<PeerDomain>> Domain(absl::string_view peer);

  // A QP in INIT with its receives posted, owned by `link`: one that sends (in the
  // NIC's PD; `domain` null) or one that receives from `domain`'s peer.
  // RESOURCE_EXHAUSTED when every table slot is taken. It comes back busy: a close
  // (CloseAll, a port error) is deferred and the poller neither destroys nor frees it,
  // so the caller may use the pointer until it has stored it where a close reaches it
  // (its link's qps) and called ReleaseNew.
  absl::StatusOr<VerbsQp*> CreateQp(uint64_t link, std::shared_ptr<PeerDomain> domain);
  // Ends CreateQp's hold: a close deferred meanwhile moves the QP to ERR now. The
  // pointer may be freed from here on unless something else keeps it.
  void ReleaseNew(VerbsQp* qp);
  // What the far side needs to connect to it.
  uint32_t qpn(const VerbsQp* qp) const;
  uint32_t psn(const VerbsQp* qp) const;
  // INIT -> RTR -> RTS towards `remote`.
  absl::Status ConnectQp(VerbsQp* qp, const RemoteQp& remote);
  // The QP belongs to `peer` (called `name`): its arrivals name it, it takes writes.
  void Activate(VerbsQp* qp, PeerId peer, absl::string_view name);
  // Whether the QP takes writes: kNo, or kLater (it is being renewed: they wait in its
  // ring), or kNow.
  enum class Takes { kNo, kLater, kNow };
  Takes takes_writes(VerbsQp* qp) const;

  // Renewal of a QP that sends, after a refusal (NicHost::OnQpRefused), off the poller:
  // ERR -> RESET -> INIT with its receives posted again; returns the new PSN to send
  // in QP_RENEW. On failure the QP is closed (its held writes complete UNAVAILABLE).
  absl::StatusOr<uint32_t> RestartQp(VerbsQp& qp);
  // Then, with the target's new QP: RTR -> RTS, the held writes posted again in order,
  // and the QP takes writes again. On failure the QP is closed.
  absl::Status ResumeQp(VerbsQp& qp, uint32_t remote_qpn, uint32_t remote_psn);
  // Starts the two-phase teardown; idempotent, any thread.
  void CloseQp(VerbsQp* qp, const absl::Status& why);
  void CloseAll(const absl::Status& why);
  // Blocks until every QP has been destroyed.
  void WaitUntilNoQps();
  // Delivers the staged arrivals still being copied, then stops the lander. After
  // WaitUntilNoQps: no arrival comes any more.
  void StopLander() {
    if (lander_ != nullptr) lander_->Stop();
  }

  // Queues a write on `qp`, into the target extent registered as `rkey` at
  // `remote_address` (both unused for a notification). Never blocks, never allocates.
  // RESOURCE_EXHAUSTED when the NIC's quota or the QP's ring is full, UNAVAILABLE when
  // the QP is closing. A QP being renewed takes the write into its ring, to be posted
  // with the held writes once it is connected again.
  absl::Status Post(VerbsQp* qp, const WriteOp& op, WriteSource source,
                    uint64_t remote_address, uint32_t rkey);

  uint64_t transmitted_bytes() const { return transmitted_bytes_.load(); }
  uint64_t received_bytes() const { return received_bytes_.load(); }
  // As NicCounters: writes the target's NIC refused, and arrivals for windows
  // already closed, crossed the link too.
  uint64_t wire_tx_bytes() const { return wire_tx_bytes_.load(); }
  uint64_t wire_rx_bytes() const { return wire_rx_bytes_.load(); }
  uint64_t malformed() const { return malformed_.load(); }
  // As a source: writes the target's NIC refused. As a target: arrivals for windows
  // already closed, and writes refused in software (CountRefused, QUERY answers).
  uint64_t refused() const { return refused_.load(); }
  void CountRefused() { refused_.fetch_add(1, std::memory_order_relaxed); }
  // Control connections accepted on this NIC and closed before they proved a key.
  uint64_t auth_failures() const { return auth_failures_.load(); }
  void CountAuthFailure() { auth_failures_.fetch_add(1, std::memory_order_relaxed); }
  // Control connections on this NIC (either end) closed because a frame, once begun,
  // stopped arriving (FABRIC_STALL).
  uint64_t stalled_links() const { return stalled_links_.load(); }
  void CountStalledLink() { stalled_links_.fetch_add(1, std::memory_order_relaxed); }
  // Control connections accepted on this NIC and refused because their peer held its
  // share of them already (FABRIC_PEER_CONNECTIONS).
  uint64_t peer_link_refusals() const { return peer_link_refusals_.load(); }
  void CountPeerLinkRefusal() {
    peer_link_refusals_.fetch_add(1, std::memory_order_relaxed);
  }
  // Renewals of QPs after a refusal that put their writes back on the wire.
  uint64_t renewals() const { return renewals_.load(); }
  // QPs closed because their outstanding writes saw no acknowledgement: within
  // NicSizing::ack_timeout (the watchdog), or through the RC receiver-not-ready
  // retries.
  uint64_t ack_timeouts() const { return ack_timeouts_.load(); }

 private:
  Nic(int index, NicBinding binding, const NicSizing& sizing, const RcParams& rc,
      NicHost& host);
  void Poll();
  // On the lander: copies a staged arrival's bytes from the window's host shadow into
  // GPU memory, then delivers it (the placement keeps the window open until then).
  void Land(WindowTable::Placement& placement, Arrival arrival);
  void Handle(const ibv_wc& wc);
  void HandleSend(VerbsQp& qp, const ibv_wc& wc, const wr_id::Fields& id);
  void HandleRecv(VerbsQp& qp, const ibv_wc& wc, const wr_id::Fields& id);
  absl::Status PostRecvSlot(VerbsQp& qp, uint32_t slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(qp.mu);
  absl::Status PostRecvs(VerbsQp& qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(qp.mu);
  // Ends a step that held the QP busy (CreateQp's, a renewal step's): a close that
  // came meanwhile moves it to ERR now. True when one came.
  static bool EndBusy(VerbsQp& qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(qp.mu);
  // Posts the write in ring position `position` (WRITE + SEND).
  absl::Status PostSlot(VerbsQp& qp, uint64_t position)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(qp.mu);
  // The renewal may start: every WR of the refused QP is back. Marks it requested.
  bool ReadyToRenew(VerbsQp& qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(qp.mu);
  // A write refused on an active QP: the QP holds the writes behind it for a renewal
  // (kRenewing). False when the QP is not active: it closes instead.
  bool HoldForRenewal(VerbsQp& qp, WindowKey refused_window)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(qp.mu);
  void FinalizeDrained();
  void ExpireRenewals();
  // Closes every active QP whose writes made no progress within ack_timeout.
  void ExpireStalledWrites();
  void DrainAsyncEvents();
  bool NoQps() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_mu_) { return live_qps_ == 0; }

  const int index_;
  const NicBinding binding_;
  const NicSizing sizing_;
  const RcParams rc_;
  NicHost& host_;

  // Declared in teardown order reversed: members die bottom-up, so QPs (in the table)
  // go before the receive arena's MR, which goes before the CQ, the PD, the context.
  Context context_;
  ProtectionDomain pd_;
  CompletionQueue cq_;
  std::vector<uint8_t> recv_arena_;  // max_qps * recv_depth Descriptors
  MemoryRegion recv_mr_;

  absl::Mutex domains_mu_;
  std::unordered_map<std::string, std::weak_ptr<PeerDomain>> domains_
      ABSL_GUARDED_BY(domains_mu_);

  mutable absl::Mutex table_mu_;
  // Shared: a renewal in progress keeps its QP object alive (not its ibv_qp, which the
  // poller destroys once the QP is drained).
  std::vector<std::shared_ptr<VerbsQp>> owned_ ABSL_GUARDED_BY(table_mu_);
  std::vector<uint32_t> generations_ ABSL_GUARDED_BY(table_mu_);
  int live_qps_ ABSL_GUARDED_BY(table_mu_) = 0;
  // The poller's lock-free view of owned_.
  std::unique_ptr<std::atomic<VerbsQp*>[]> slots_;
  std::atomic<int> closing_{0};
  std::atomic<int> renewing_{0};

  std::atomic<uint32_t> send_quota_used_{0};
  std::atomic<uint64_t> transmitted_bytes_{0};
  std::atomic<uint64_t> received_bytes_{0};
  std::atomic<uint64_t> wire_tx_bytes_{0};
  std::atomic<uint64_t> wire_rx_bytes_{0};
  std::atomic<uint64_t> malformed_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> auth_failures_{0};
  std::atomic<uint64_t> stalled_links_{0};
  std::atomic<uint64_t> peer_link_refusals_{0};
  std::atomic<uint64_t> renewals_{0};
  std::atomic<uint64_t> ack_timeouts_{0};

  // Staged arrivals (and, behind them, every arrival of this NIC, to keep the order)
  // queued on the lander, which exists with a device stager; its stage is made there
  // on first use. QPs are finalized only while none is queued.
  std::atomic<int> landing_{0};
  std::atomic<uint64_t> landing_failures_{0};
  std::unique_ptr<DeviceStage> landing_stage_;
  std::unique_ptr<Worker> lander_;

  std::atomic<bool> stop_{false};
  std::thread poller_;
};

}  // namespace fuselink::fabric::verbs
