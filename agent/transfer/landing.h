// The target side of transfers: the incoming slots PrepareIncoming reserves, the
// windows they open, the bytes that land in them, and the verdict that ends each one.
// Thread-safe.
//
// The rules it keeps (docs/design.md, "Completion and placement"):
//  - Placement: a slot's window (fabric.h) holds exactly the slot's target blocks and
//    only the slot's source may write through it; the fabric places nothing else.
//  - Counting: a slot counts distinct bytes (a chunk landing twice counts once), and
//    only those inside its blocks.
//  - The target decides: a slot ends with one verdict (verdict.h) — completed only
//    when a commit has come and every byte of every block has landed. A commit that
//    comes before another NIC's data has been counted waits up to commit_grace for it.
//  - A verdict is told (watchers, the source's verdict notice, GetIncoming) only once
//    the window is closed and drained: no byte of the slot lands after anyone hears
//    how it ended.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/stats.h"
#include "agent/fabric/fabric.h"
#include "agent/memory/registry.h"
#include "agent/topo/topology.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/landed_ranges.h"
#include "agent/transfer/verdict.h"
#include "fuselink/v1/agent.pb.h"
#include "fuselink/v1/peer.pb.h"

namespace fuselink::transfer {

// The shortest idle timeout the agent takes: a source that stalls for less (a GC
// pause, a slow prepare on its side) must not lose its transfer.
inline constexpr absl::Duration kMinIdleTimeout = absl::Seconds(1);

struct LandingOptions {
  // A slot that sees nothing from its source for this long fails SOURCE_IDLE. The
  // agent takes kMinIdleTimeout to kMaxTimeoutMs; tests go shorter.
  absl::Duration idle_timeout = absl::Seconds(30);
  // How long a commit waits for bytes that landed but are not counted yet (verbs:
  // another NIC's completions not yet polled) before it fails INCOMPLETE_COMMIT.
  absl::Duration commit_grace = absl::Seconds(2);
  // A slot whose source has sent nothing at all this long after it was prepared
  // fails SOURCE_IDLE: a transfer that never starts pins its tensor only briefly.
  absl::Duration start_timeout = absl::Seconds(5);
  // Slots one source may hold at once, open or closing (their windows not yet
  // drained): its share of kMaxIncoming, so that one peer (or one client through it)
  // cannot take every slot, nor by ending slots as fast as it opens them. 1 to
  // kMaxIncoming.
  uint32_t max_per_source = kMaxIncoming / 4;

  // INVALID_ARGUMENT naming the first field out of the agent's range above
  // (agent/common/options.h).
  absl::Status Validate() const;
};

// Receives the end of every incoming transfer, with no lock held.
using WatchFn = std::function<void(const v1::WatchEvent& event)>;
// Sends `imm` (a verdict) to node `source` on the fabric. Must not block.
using NoticeFn = std::function<void(const std::string& source, uint32_t imm)>;
// Receives this node's idle-NIC mask whenever it changes, with no lock held.
using IdleFn = std::function<void(uint32_t idle_mask)>;

// Bytes that landed through one NIC: for its owner GPU's tensors, or for others'
// (data that a source sent over a NIC it borrowed).
struct LandingNicStats {
  uint64_t own_bytes = 0;
  uint64_t borrowed_bytes = 0;
  bool owner_busy = false;
};

class Landing {
 public:
  // `nic_count`: this node's NICs (rails). `fabric` opens and closes the windows.
  Landing(memory::Registry* registry, fabric::Fabric* fabric, int nic_count,
          WatchFn on_event, NoticeFn on_notice, IdleFn on_idle,
          LandingOptions options = {});
  ~Landing();

  // Checks the target side of a transfer, opens its window for the source and
  // reserves a slot. Blocks while the fabric opens the window.
  // `may_write` says whether the transfer may write into the tensor (its grants),
  // checked on the pinned tensor. RESOURCE_EXHAUSTED (SOURCE_SHARE) when the source
  // holds max_per_source slots already, open or closing (share_refusals counts it).
  // `from` kThisNode: an in-node move (fabric/in_node_fabric.h), whose source is this
  // node's own engine. Its bytes load no NIC: they count in local_bytes(), not in any
  // NIC's own or borrowed bytes, and its slot makes no NIC busy (IdleMask).
  enum class Source { kPeer, kThisNode };
  absl::StatusOr<v1::PrepareIncomingResponse> Prepare(
      const v1::PrepareIncomingRequest& request,
      absl::FunctionRef<absl::Status(const memory::TensorInfo&)> may_write =
          [](const memory::TensorInfo&) { return absl::OkStatus(); },
      Source from = Source::kPeer);
  // Whether Prepare may block (the fabric's OpenWindow may wait); when false it only
  // takes locks, and a gRPC thread may run it.
  bool PrepareMayBlock() const { return fabric_->OpenWindowMayWait(); }

  // A write or notice from a source (not idle masks or verdicts: those are the
  // engine's).
  void OnArrival(const fabric::Arrival& arrival);
  // Ends every open slot whose source is `peer_name` (PEER_LOST).
  void OnPeerLost(absl::string_view peer_name);
  // Ends the open slots into tensor `tensor_id` (TensorLease::id) with `why`.
  void AbortTensor(uint64_t tensor_id, const absl::Status& why);
  // Ends slots idle past idle_timeout, and commits that waited past commit_grace.
  void Expire(absl::Time now);
  // Ends every open slot SHUTTING_DOWN; no slot is prepared afterwards.
  void Shutdown();

  // How the slot of `transfer_id` from `source_node` stands: open, or its verdict.
  // NOT_FOUND (UNKNOWN_TRANSFER) when no slot remembers it.
  absl::StatusOr<v1::IncomingState> Query(absl::string_view source_node,
                                          absl::string_view transfer_id) const;

  // Arrivals that named no open slot of theirs (stale generation, unknown slot,
  // another source's slot), or strayed outside their slot's blocks.
  uint64_t stray_writes() const { return stray_writes_.load(); }
  // Slots that ended PROTOCOL because their source's writes left more disjoint
  // landed ranges than a transfer of their blocks can (a bound on the slot's memory).
  uint64_t scattered_writes() const { return scattered_writes_.load(); }
  // Slots that ended because their source never sent a byte (start_timeout).
  uint64_t unstarted_expired() const { return unstarted_expired_.load(); }
  // PrepareIncoming calls refused because their source held its share.
  uint64_t share_refusals() const { return share_refusals_.load(); }
  size_t active() const;
  // Bit k set when no open slot has rail k as its source's direct NIC: no owner
  // traffic arrives on NIC k, and sources may borrow it. (With rails, GPU s on the
  // source reaches any GPU here through NIC s; that is the NIC it loads.) A NIC
  // receiving foreign traffic (SetForeignBusy) is not idle either.
  uint32_t IdleMask() const;
  // Bit k set: NIC k receives foreign traffic (agent/nicstat), so sources must not
  // borrow it towards this node. Replaces the previous mask; a change of the idle
  // mask is told to the sources at once.
  void SetForeignBusy(uint32_t mask);
  // Bytes the slots whose windows are open (or draining) can take now: per slot, what
  // it still expects, or less, the bytes its source said it keeps in flight at most.
  // Every byte the fabric places here lands inside one of them, so this bounds the
  // bytes arriving towards this node that the fabric has not counted yet, whatever
  // the sources' policies or depth flags (the foreign-traffic watch's receive
  // slack). Not in it: a chunk sent again after a failure, a write still in flight
  // to a window that has closed.
  uint64_t AdmissibleBytes() const;
  // Nodes with open slots here: the ones to tell of idle-mask changes.
  std::vector<std::string> ActiveSources() const;
  LandingNicStats Stats(int nic) const;
  // Bytes that in-node moves placed here.
  uint64_t local_bytes() const { return local_bytes_.load(std::memory_order_relaxed); }

  // Per NIC: bytes landed (own and borrowed), the owner's incoming traffic; slots,
  // strays, refusals and ends.
  void ReportStats(stats::Sink& sink) const;

 private:
  enum class SlotState { kFree, kOpen, kClosing, kClosed };
  struct Slot {
    uint32_t generation = 0;
    SlotState state = SlotState::kFree;
    uint32_t live_at = 0;  // its place in live_ while open or closing
    std::string source_node;
    std::string transfer_id;
    memory::TensorLease tensor;
    std::vector<uint32_t> block_ids;
    uint32_t layer_begin = 0, layer_end = 0;
    int rail = 0;        // the source's direct NIC: its own traffic arrives on this rail
    bool local = false;  // an in-node move: no NIC carries it
    // By target region; 0 for a region the transfer does not write.
    std::vector<fabric::WindowKey> windows;
    std::vector<fabric::Extent> blocks;  // the windows' extents, in tensor offsets
    uint64_t expected_bytes = 0;
    // The source's bytes in flight at most (PrepareIncomingRequest); 0: not said.
    uint64_t in_flight_bytes = 0;
    LandedRanges landed;
    // The most disjoint ranges `landed` may hold (MaxLandedRanges in landing.cc);
    // past it the slot fails PROTOCOL.
    size_t max_landed_ranges = 0;
    uint64_t landed_bytes = 0;  // distinct bytes, kept once the ranges are let go
    absl::Time last_activity;
    bool started = false;  // something arrived from the source
    absl::Time commit_deadline = absl::InfiniteFuture();  // a commit waits for bytes
    absl::Status verdict;                                 // once closing
  };
  // Starts ending an open slot with `verdict`; the caller then calls Drain with the
  // slot's index, generation and window after releasing mu_.
  struct Ending {
    uint32_t index;
    uint32_t generation;
    std::vector<fabric::WindowKey> windows;
  };
  // One window per region that `blocks` (tensor offsets, sorted) fall in; none stays
  // open on an error.
  absl::StatusOr<std::vector<fabric::WindowKey>> OpenWindows(
      const memory::TensorLease& tensor, absl::string_view source,
      std::span<const fabric::Extent> blocks);
  // Closes the windows (0s skipped); `drained` runs once all have drained.
  void CloseWindows(const std::vector<fabric::WindowKey>& windows,
                    absl::AnyInvocable<void() &&> drained);
  Ending BeginCloseLocked(uint32_t index, absl::Status verdict)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the window; the slot is told once it has drained.
  void Drain(const Ending& ending);
  void DrainAll(const std::vector<Ending>& endings);
  // The window drained: the verdict is final and told.
  void Finish(uint32_t index, uint32_t generation);
  // Takes the oldest free slot, opens it under its next generation and makes it live;
  // the caller fills in its transfer. There must be a free slot (CheckRoomLocked).
  uint32_t OpenSlotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Handles one data arrival under mu_; may begin ending the slot.
  std::optional<Ending> OnDataLocked(const fabric::Arrival& arrival, Slot& slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t IdleMaskLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same from owner traffic alone.
  uint32_t OwnerIdleMaskLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls on_idle_ if the mask moved since it was last told. Serialized by tell_mu_,
  // not mu_: on_idle_ calls ActiveSources, which takes mu_.
  void TellIdle() ABSL_LOCKS_EXCLUDED(mu_, tell_mu_);

  memory::Registry* const registry_;
  fabric::Fabric* const fabric_;
  const int nic_count_;
  const WatchFn on_event_;
  const NoticeFn on_notice_;
  const IdleFn on_idle_;
  const LandingOptions options_;
  // This agent's incarnation, told to every source in PrepareIncomingResponse.
  const uint64_t incarnation_;
  std::atomic<uint64_t> stray_writes_{0};
  std::atomic<uint64_t> unstarted_expired_{0};
  std::atomic<uint64_t> scattered_writes_{0};
  std::atomic<uint64_t> share_refusals_{0};
  struct alignas(64) NicBytes {
    std::atomic<uint64_t> own{0}, borrowed{0};
  };
  std::array<NicBytes, kMaxNics> nic_bytes_;
  std::atomic<uint64_t> local_bytes_{0};
  absl::Mutex tell_mu_;
  uint32_t told_mask_ ABSL_GUARDED_BY(tell_mu_) = UINT32_MAX;
  std::atomic<uint32_t> foreign_busy_{0};

  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);  // kMaxIncoming, fixed
  // Free slots, oldest first: reuse in FIFO order spreads generations (imm.h).
  std::deque<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  // The slots open or closing, in no order: what every walk over slots (expiry, the
  // idle mask's sources, the foreign watch's bound, a lost peer) visits, so that it
  // costs the transfers that are live rather than all kMaxIncoming slots. FIFO reuse
  // cycles through every slot, so no prefix of slots_ would do.
  std::vector<uint32_t> live_ ABSL_GUARDED_BY(mu_);
  // Slots that still remember their transfer (open, closing, or closed and not yet
  // reused), by source node and transfer id (TransferKey): one source cannot shadow
  // another's transfer by naming its id.
  static std::string TransferKey(absl::string_view source_node,
                                 absl::string_view transfer_id);
  absl::flat_hash_map<std::string, uint32_t> by_transfer_ ABSL_GUARDED_BY(mu_);
  std::array<uint32_t, kMaxNics> owner_slots_ ABSL_GUARDED_BY(mu_) = {};
  size_t open_ ABSL_GUARDED_BY(mu_) = 0;
  // Open and closing slots by source node: a closing slot holds its window (and its
  // tensor) until the window drains, so it counts against the share until Finish.
  absl::flat_hash_map<std::string, uint32_t> per_source_ ABSL_GUARDED_BY(mu_);
  // RESOURCE_EXHAUSTED when no slot is free or `source` holds its share.
  absl::Status CheckRoomLocked(const std::string& source)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace fuselink::transfer
