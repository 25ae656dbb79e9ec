// Which NIC carries each chunk: the FuseLink scheduler, and the two policies it is
// compared with. One Scheduler per node, shared by every transfer; lock-free, no
// allocation after construction, safe to call from any thread.
//
// fuselink (the default):
//  - Every NIC has an owner GPU. A chunk of a transfer whose home GPU owns NIC d goes
//    on d while d has fewer than `direct_depth` chunks in flight, and fewer than its
//    even share of what the transfer has left to land beside the NICs it may borrow
//    now (never under `borrow_depth`): a short transfer, or a long one's tail,
//    spreads over the lent NICs rather than queueing on its own, as stripe's would.
//    The deep direct queue is for long transfers, whose acknowledgements may wait
//    behind traffic the other way.
//  - Past that it borrows: a NIC k whose owner is idle here, that the receiver says
//    is idle there (its credit mask), with fewer than `borrow_depth` borrowed chunks
//    in flight; the least loaded such NIC, scanned from a rotating start so borrowers
//    share fairly. Else the chunk waits for its direct NIC, unless the transfer has
//    no chunk in flight there: then it goes there over the depth. The depth bounds
//    the NIC's queue, which every transfer of its GPU shares; without that floor the
//    transfers already in the queue, which refill it as their chunks land, keep a
//    transfer that starts later out for as long as they run (in an all-to-all,
//    longer than the target waits for a first byte).
//  - An owner is busy while it has a running transfer, and while it posted or
//    completed chunks since the last look; the look is taken every kStatusEvery picks
//    and at once when an owner's transfer starts. A busy owner's NIC takes no new
//    borrowed chunk; those in flight drain, at most `borrow_depth` of them: the
//    owner waits for at most that many.
//  - A NIC whose link carries foreign traffic (bytes fuselink did not move, above a
//    threshold: agent/nicstat and foreign_rule.h) is busy for lending the same way:
//    SetForeignBusy names those NICs, they take no new borrowed chunk and their
//    borrowed chunks in flight drain. Their owners' own chunks still go: foreign
//    traffic does not take a GPU's own NIC away from it.
// static: the direct NIC only (NIC binding, as clusters run today).
// stripe: the least loaded NIC, owners ignored.
// Every policy keeps to the NICs a transfer can still use (`usable`): a NIC whose
// writes to that peer failed is left out, and when the direct NIC is the one, the
// least loaded usable NIC takes the chunk whatever its owner does (a failover is
// not a borrow to be given back politely).
//
// Pick reserves: the chosen NIC's counters are raised before Pick returns, so bounds
// hold under concurrency; every reservation ends in exactly one Complete.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/common/limits.h"
#include "agent/common/stats.h"

namespace fuselink::sched {

// Owner states are re-read every this many picks (the paper's value).
inline constexpr uint32_t kStatusEvery = 8;

enum class Policy { kStatic, kStripe, kFuselink };

// "static", "stripe" or "fuselink"; INVALID_ARGUMENT (UNKNOWN_POLICY) otherwise.
absl::StatusOr<Policy> ParsePolicy(absl::string_view name);
absl::string_view PolicyName(Policy policy);

// The deepest either of Limits' depths may be: chunks in flight on one NIC.
inline constexpr uint32_t kMaxDepth = 1024;

struct Limits {
  // Chunks in flight on a NIC before its owner's next chunk spills to a borrowed one.
  // 0 (a test's setting; the agent takes 1 to kMaxDepth): every chunk borrows.
  uint32_t direct_depth = 8;
  // Borrowed chunks in flight on one NIC: what a returning owner waits for at most.
  // 0 to kMaxDepth.
  uint32_t borrow_depth = 2;

  // INVALID_ARGUMENT naming the first depth out of the agent's range above
  // (agent/common/options.h).
  absl::Status Validate() const;
};

// A reservation: the NIC a chunk goes on, and whether it is borrowed there.
struct Choice {
  int nic = -1;  // -1: none now; retry after a completion
  bool borrowed = false;
  bool ok() const { return nic >= 0; }
};

// Counters of one NIC, for metrics. Monotonic except the gauges.
struct NicStats {
  bool owner_busy = false;
  uint32_t in_flight = 0;           // gauge
  uint32_t borrowed_in_flight = 0;  // gauge
  uint64_t own_bytes = 0;           // completed chunks of the owner
  uint64_t borrowed_bytes = 0;      // completed chunks of borrowers
  uint64_t borrow_events = 0;       // borrowing began on an idle NIC
  uint64_t give_back_events = 0;    // the owner returned while it was lent
  uint64_t failed_chunks = 0;       // writes that failed on this NIC
  // Sampled (SampleIdle): time with nothing in flight here while a transfer of this
  // node waited to place a chunk.
  uint64_t idle_while_demand_ns = 0;
};

class Scheduler {
 public:
  // A node of `nics` NICs. NIC k's owner is whoever sends with k as its direct NIC
  // (the GPU the topology gives it).
  Scheduler(Policy policy, int nics, Limits limits);

  Policy policy() const { return policy_; }

  // A chunk of a transfer whose direct NIC is `direct`; `remote_idle` has bit k set
  // when the receiver's NIC k is idle, `usable` when the transfer may use NIC k;
  // `remaining`: the transfer's chunks not yet landed, this one included (unknown:
  // kManyChunks); `own_direct`: its chunks reserved on `direct` now (unknown:
  // kManyChunks, which never takes the direct NIC over its depth).
  static constexpr uint32_t kManyChunks = UINT32_MAX;
  Choice Pick(int direct, uint32_t remote_idle, uint32_t usable = ~0u,
              uint32_t remaining = kManyChunks, uint32_t own_direct = kManyChunks);
  // The reserved chunk finished: `bytes` landed (0 if it was never posted), or the
  // write `failed`. Returns, when this ended a give-back, how long the owner waited
  // for borrowers to leave its NIC, in nanoseconds; else 0.
  int64_t Complete(Choice choice, uint64_t bytes, bool failed = false);

  // A transfer whose direct NIC is `nic` started or ended: its owner is busy.
  void OwnerStarted(int nic);
  void OwnerStopped(int nic);

  // Bit k set: NIC k carries foreign traffic and lends nothing (fuselink policy).
  // Replaces the previous mask; a NIC newly set while lent begins a give-back.
  void SetForeignBusy(uint32_t mask);

  // Re-reads every owner's state now; the engine calls it on a timer so that states
  // settle when no chunk is being picked.
  void Refresh() { Look(); }

  // A sample, taken on the engine's timer: for the `elapsed_ns` since the last one a
  // transfer of this node `waited` for a NIC (or not). Each NIC with no chunk in
  // flight and no foreign traffic counts them as idle while demand waited: capacity
  // the policy left unused. A lower bound: a NIC whose chunks wait at a busy
  // receiver sends nothing either, yet has chunks in flight.
  void SampleIdle(int64_t elapsed_ns, bool waited);

  // Bit k set when this node's NIC k has an idle owner and no foreign traffic.
  uint32_t IdleMask() const;
  NicStats Stats(int nic) const;

  // Per NIC: bytes sent (own and borrowed), lending and give-backs, failed writes.
  void ReportStats(stats::Sink& sink) const;

 private:
  struct alignas(64) Nic {
    std::atomic<uint32_t> in_flight{0};
    std::atomic<uint32_t> borrowed_in_flight{0};
    std::atomic<uint32_t> owner_transfers{0};
    std::atomic<uint64_t> owner_activity{0};  // the owner's posts and completions
    std::atomic<uint64_t> activity_seen{0};   // owner_activity at the last look
    std::atomic<bool> busy{false};
    std::atomic<int64_t> give_back_since_ns{0};  // 0: no give-back under way
    std::atomic<uint64_t> own_bytes{0}, borrowed_bytes{0};
    std::atomic<uint64_t> borrow_events{0}, give_back_events{0}, failed_chunks{0};
    std::atomic<uint64_t> idle_while_demand_ns{0};
  };

  // Re-reads every owner's state.
  void Look();
  void SetBusy(int nic, bool busy);
  // A lending NIC stopped lending: counts a give-back and starts its clock if
  // borrowed chunks are in flight there.
  static void BeginGiveBack(Nic& nic);
  // Neither its owner nor foreign traffic keeps NIC k from lending.
  bool Lendable(int k) const;
  // Raises `counter` if it is under `bound`; `*before` gets its old value.
  static bool Reserve(std::atomic<uint32_t>& counter, uint32_t bound, uint32_t* before);
  Choice PickFuselink(int direct, uint32_t remote_idle, uint32_t usable,
                      uint32_t remaining, uint32_t own_direct);
  // The direct NIC, reserved whatever its depth.
  Choice TakeDirect(int direct);
  // The least loaded NIC of `usable` (rotating among equals), reserved; -1 if none.
  Choice PickLeastLoaded(uint32_t usable);

  const Policy policy_;
  const int nics_;
  const Limits limits_;
  std::atomic<uint32_t> picks_{0};
  std::atomic<uint32_t> rotate_{0};
  std::atomic<uint32_t> foreign_busy_{0};
  std::array<Nic, kMaxNics> nic_;
};

}  // namespace fuselink::sched
