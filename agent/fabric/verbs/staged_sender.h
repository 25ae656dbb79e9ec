// The sender of one NIC's deferred writes (verbs/fabric_writes.cc: writes staged out
// of GPU memory the NIC cannot read, and writes behind a fence): a queue per peer,
// one thread that serves the peers in turn and never waits on one peer's resources,
// and the share of the NIC's bounce slots (verbs/staging.h) each peer may hold.
//
// Why: a slot comes back only when the write holding it completes, and a stopped
// target's writes complete only after the RC retries or the ack watchdog (seconds).
// Behind one FIFO whose thread waited for a free slot, such a peer held every slot of
// the NIC and the thread with them: every deferred write of the NIC, to every other
// peer, stopped meanwhile.
//
// Contract:
//  - One peer's writes are tried in the order queued, each only once the one before
//    it is done (FIFO per peer); the peers' first writes are tried in turn
//    (round-robin by peer).
//  - Write::Try runs on the thread and says what became of its write: kDone (posted,
//    or failed and its completion reported), kNoSlot (TryClaimSlot refused it: tried
//    again once any slot comes back) or kRetry (tried again at `retry_at`, e.g. a
//    spent QP quota). Until then its peer's later writes wait; other peers' go on.
//    Try may block on local work of its own (a fence, a GPU copy), never on a peer.
//  - The thread sleeps only while no peer's first write can be tried: until a write
//    is queued, a slot comes back, the earliest retry_at, or Stop.
//  - Slots: a peer holds at most `slots_per_peer` claims at once, all peers together
//    at most `slots`. A claim goes back when the last copy of its handle is let go.
//  - Stop: the thread tries every queued write once more; one that still cannot go on
//    is abandoned (Write::Abandon fails it). So every queued write ends exactly once,
//    in a Try that answers kDone or in Abandon. A write queued after Stop is abandoned
//    on the caller's thread.
//
// Threads: Queue, TryClaimSlot and letting go of a claim from any thread; each takes
// the sender's lock briefly, which is never held across a call out (Try, Abandon), so
// a CQ poller may let go of a claim. Try and Abandon run on the thread, unlocked
// (Abandon also on Queue's caller, after Stop).
// Bounds: the queues hold what the producer admits (the fabric: queue_depth_per_nic
// writes per NIC, counted until each ends); a lane exists only while its peer has
// writes queued, a claim count only while its peer holds a slot (at most `slots`).
// Lifetime: every claim is let go before the sender is destroyed (checked).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/fabric/fabric.h"

namespace fuselink::fabric::verbs {

class StagedSender {
 public:
  enum class Outcome : uint8_t { kDone, kNoSlot, kRetry };
  struct Step {
    Outcome outcome = Outcome::kDone;
    absl::Time retry_at = absl::InfinitePast();  // kRetry: not tried before then
  };
  // One queued write; the sender owns it until it ends.
  class Write {
   public:
    virtual ~Write() = default;
    // On the thread: one more attempt (see the contract above).
    virtual Step Try() = 0;
    // Ends the write, failed with `why` (UNAVAILABLE), without another attempt.
    virtual void Abandon(const absl::Status& why) = 0;
  };

  // `name`: its thread's (NameThisThread). 1 <= slots_per_peer <= slots.
  StagedSender(const char* name, uint32_t slots, uint32_t slots_per_peer);
  // Stop().
  ~StagedSender();
  StagedSender(const StagedSender&) = delete;
  StagedSender& operator=(const StagedSender&) = delete;

  // Queues `write` behind `peer`'s earlier writes. Never blocks.
  void Queue(PeerId peer, std::unique_ptr<Write> write);
  // A claim on one of the slots for `peer`, or null when `peer` holds its share or
  // every slot is claimed. Never blocks.
  std::shared_ptr<const void> TryClaimSlot(PeerId peer);
  // Ends every queued write (see the contract), then joins. Idempotent; not from Try.
  void Stop();

  uint32_t slots_per_peer() const { return slots_per_peer_; }
  // Claims `peer` holds now.
  uint32_t slots_held(PeerId peer) const;
  // Writes that waited because their peer held its share (each write counted once).
  uint64_t share_waits() const;

 private:
  enum class Wait : uint8_t { kNone, kSlot, kUntil };
  // One peer's queued writes. The thread takes the first out while it tries it.
  struct Lane {
    std::deque<std::unique_ptr<Write>> writes;  // never empty between turns
    Wait wait = Wait::kNone;
    absl::Time until;            // kUntil
    bool share_counted = false;  // its first write is in share_waits_ already
  };
  struct Turn {
    PeerId peer = 0;
    std::unique_ptr<Write> write;
    uint64_t returns_seen = 0;  // returns_ when it was taken
  };

  void Loop();
  // The next write to try, round-robin; waits for one. None once stopped.
  std::optional<Turn> NextTurn();
  // After `turn`'s Try answered `step`: false when it must be abandoned (stopping).
  bool Settle(Turn& turn, const Step& step);
  void ReturnSlot(PeerId peer);
  std::map<PeerId, Lane>::iterator NextLane() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time EarliestRetry() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasTurn() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t slots_;
  const uint32_t slots_per_peer_;
  const char* const name_;
  mutable absl::Mutex mu_;
  std::map<PeerId, Lane> lanes_ ABSL_GUARDED_BY(mu_);
  PeerId last_served_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<PeerId, uint32_t> held_ ABSL_GUARDED_BY(mu_);  // > 0 each
  uint32_t claimed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t returns_ ABSL_GUARDED_BY(mu_) = 0;  // claims let go since start
  uint64_t share_waits_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // the thread is gone
  std::thread thread_;  // last: starts once the members above are made
};

}  // namespace fuselink::fabric::verbs
