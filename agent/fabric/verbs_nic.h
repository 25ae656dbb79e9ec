// One NIC of the verbs fabric: its device context, protection domain, one completion
// queue shared by every QP on it, the receive-buffer arena, the QP table, and the
// thread that polls the CQ.
//
// Data path. A write is two work requests chained in one ibv_post_send on one RC QP:
//   1. IBV_WR_RDMA_WRITE, unsignaled: the payload, straight from the registered source
//      into the target's region (remote address + rkey pushed by the target, see
//      verbs_link.h). Omitted for a 0-byte write (a notification).
//   2. IBV_WR_SEND_WITH_IMM, signaled, inline: a 16-byte Descriptor {key, bytes,
//      offset} with the caller's immediate.
// Why not RDMA WRITE WITH IMMEDIATE alone: its receive completion carries only the
// immediate and the length, while Fabric's Arrival promises the region key and offset
// (the landing layer checks the key). The SEND is inline (no DMA read, ~no cost next to
// a chunk) and RC orders it after the WRITE, so its receive completion on the target
// means the payload is in place, and its send completion on the source means the
// target has acknowledged both.
//
// CQE quota. Each QP keeps recv_depth receives posted: reserved when the QP takes a
// table slot, so at most max_qps * recv_depth receive CQEs. Each write reserves one
// unit of the NIC's send quota (queue_depth) in PostWrite and returns it when its SEND
// completes; a write makes at most two CQEs (on error the unsignaled WRITE reports too,
// then the SEND flushes). The CQ holds 2 * queue_depth + max_qps * recv_depth entries,
// so it can never overflow; a spent quota answers RESOURCE_EXHAUSTED.
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
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/verbs_device.h"
#include "agent/fabric/verbs_wrap.h"

namespace fuselink::fabric::verbs {

// Bounds, encoded in wr_id below.
inline constexpr uint32_t kMaxQpsPerNic = 4096;
inline constexpr uint32_t kMaxWrDepth = 1 << 14;
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
  RegionKey key = 0;
  uint32_t bytes = 0;
  uint64_t offset = 0;
};
static_assert(sizeof(Descriptor) == 16, "the descriptor is 16 bytes on the wire");

// Sizes of one NIC's queues, fixed at start-up.
struct NicSizing {
  uint32_t max_qps = 64;
  uint32_t send_depth_per_qp = 128;  // writes in flight on one QP
  uint32_t recv_depth_per_qp = 128;  // receives kept posted on one QP
  uint32_t queue_depth = 512;        // writes in flight on the NIC (CQE quota)
  uint32_t max_write_bytes = 64 << 20;
};

// Where the source of a write lives on this NIC, and what keeps it alive.
struct WriteSource {
  uint64_t address = 0;
  uint32_t lkey = 0;
  std::shared_ptr<const void> hold;
};
struct WriteTarget {
  uint64_t address = 0;
  uint32_t rkey = 0;
};

class VerbsQp;

// What a NIC needs from its fabric. Called on the poller thread.
class NicHost {
 public:
  virtual ~NicHost() = default;
  virtual Handler& handler() = 0;
  // True when the key is registered and [offset, offset + bytes) inside it.
  virtual bool RegionHolds(RegionKey key, uint64_t offset, uint32_t bytes) const = 0;
  // A QP of `link` exists (before any of its CQEs can be polled).
  virtual void OnQpCreated(uint64_t link) = 0;
  // A QP of `link` is drained: every one of its writes has completed. The QP object
  // is freed when this returns; the host must forget the pointer here.
  virtual void OnQpClosed(uint64_t link, VerbsQp* qp, const absl::Status& why) = 0;
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
  ibv_pd* pd() const { return pd_.get(); }
  ibv_mtu mtu() const { return binding_.port.active_mtu; }

  // A QP in INIT with its receives posted, owned by `link`. RESOURCE_EXHAUSTED when
  // every table slot is taken.
  absl::StatusOr<VerbsQp*> CreateQp(uint64_t link);
  // What the far side needs to connect to it.
  uint32_t qpn(const VerbsQp* qp) const;
  uint32_t psn(const VerbsQp* qp) const;
  // INIT -> RTR -> RTS towards `remote`.
  absl::Status ConnectQp(VerbsQp* qp, const RemoteQp& remote);
  // The QP belongs to `peer`: its arrivals name it, and it takes writes.
  void Activate(VerbsQp* qp, PeerId peer);
  bool active(VerbsQp* qp) const;
  // Starts the two-phase teardown; idempotent, any thread.
  void CloseQp(VerbsQp* qp, const absl::Status& why);
  void CloseAll(const absl::Status& why);
  // Blocks until every QP has been destroyed.
  void WaitUntilNoQps();

  // Queues a write on `qp`. Never blocks, never allocates. RESOURCE_EXHAUSTED when the
  // NIC's quota or the QP's ring is full, UNAVAILABLE when the QP is closing.
  absl::Status Post(VerbsQp* qp, const WriteOp& op, WriteSource source,
                    WriteTarget target);

  uint64_t transmitted_bytes() const { return transmitted_bytes_.load(); }
  uint64_t received_bytes() const { return received_bytes_.load(); }
  uint64_t malformed() const { return malformed_.load(); }

 private:
  Nic(int index, NicBinding binding, const NicSizing& sizing, const RcParams& rc,
      NicHost& host);
  void Poll();
  void Handle(const ibv_wc& wc);
  void HandleSend(VerbsQp& qp, const ibv_wc& wc, const wr_id::Fields& id);
  void HandleRecv(VerbsQp& qp, const ibv_wc& wc, const wr_id::Fields& id);
  absl::Status PostRecvSlot(VerbsQp& qp, uint32_t slot);
  void FinalizeDrained();
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

  mutable absl::Mutex table_mu_;
  std::vector<std::unique_ptr<VerbsQp>> owned_ ABSL_GUARDED_BY(table_mu_);
  std::vector<uint32_t> generations_ ABSL_GUARDED_BY(table_mu_);
  int live_qps_ ABSL_GUARDED_BY(table_mu_) = 0;
  // The poller's lock-free view of owned_.
  std::unique_ptr<std::atomic<VerbsQp*>[]> slots_;
  std::atomic<int> closing_{0};

  std::atomic<uint32_t> send_quota_used_{0};
  std::atomic<uint64_t> transmitted_bytes_{0};
  std::atomic<uint64_t> received_bytes_{0};
  std::atomic<uint64_t> malformed_{0};

  std::atomic<bool> stop_{false};
  std::thread poller_;
};

}  // namespace fuselink::fabric::verbs
