// The data chunks of one transfer on the fabric: a cursor cuts its extents into
// chunks, the scheduler picks each chunk's NIC, a chunk bound for a borrowed NIC of a
// GPU tensor is staged in a relay slot there, and at most `window_chunks` writes are
// in flight. Memory is the extents and the window, never the bytes.
//
// The rules it keeps (docs/design.md, "The source engine"):
//  - Counted once: a chunk counts as landed on its one OK completion; a completion
//    that names no write in flight (repeated, late, forged) changes nothing.
//  - Failover: a transport fault (UNAVAILABLE) takes that NIC out of the transfer's
//    reach and the chunk goes again on another NIC; only when none is left is the
//    target lost (Trouble::kPeerLost).
//  - A refusal is the target's decision: the window stops posting (Trouble::kRefused)
//    and blames no NIC.
//  - Back-pressure is not failure: a full queue parks the chunk, keeping its NIC and
//    relay slot, and the window asks to wait (JobEffects::wait).
//  - No blocking: nothing here waits on a GPU or allocates device memory; slots whose
//    copy may still run are handed back through JobEffects::release_after_fence.
// Not thread-safe: the owning job's lock (its transfer's) guards every call.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "agent/fabric/fabric.h"
#include "agent/relay/pool.h"
#include "agent/sched/scheduler.h"
#include "agent/transfer/failover.h"
#include "agent/transfer/job_effects.h"
#include "agent/transfer/landed_ranges.h"
#include "agent/transfer/peer_link.h"
#include "agent/transfer/plan.h"
#include "agent/transfer/transfer.h"

namespace fuselink::transfer {

// Where the window reads from: the source tensor's regions, which its chunks' tensor
// offsets name (memory/layout.h).
struct SourceMemory {
  std::vector<memory::Region> regions;
  int gpu = -1;  // -1: host memory
};

struct WindowEnv {
  fabric::Fabric* fabric = nullptr;
  sched::Scheduler* scheduler = nullptr;
  // Relay slots for a GPU source's chunks on borrowed NICs; null for host sources
  // (every NIC reads host memory, so a borrowed NIC sends straight from the tensor)
  // and on nodes without a GPU relay.
  relay::Pool* relay = nullptr;
};

class Window {
 public:
  enum class Trouble { kNone, kRefused, kPeerLost, kFailed };

  // `reach` belongs to the job and outlives the window.
  Window(WindowEnv env, uint32_t job, int direct_nic, SourceMemory source,
         const Prepared& target, std::vector<Extent> extents, uint32_t chunk_bytes,
         uint32_t window_chunks, NicReach* reach, absl::string_view target_node);
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;

  // Posts chunks while the window, the NICs and their queues have room.
  void Pump(JobEffects* fx);
  // A completion naming window entry `entry`, post `seq`; a landed chunk is counted
  // into `transfer`, the job's. False when it names no write in flight: nothing
  // changes.
  bool OnCompletion(uint16_t entry, uint16_t seq, const fabric::Completion& completion,
                    Transfer& transfer, JobEffects* fx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(transfer.mu());
  // Posts nothing more; chunks not in flight are dropped. Writes in flight still
  // complete through OnCompletion.
  void Halt(JobEffects* fx);

  void set_remote_idle(uint32_t mask) { remote_idle_ = mask; }
  // Chunks of layers at or past `end` wait (layer by layer); see Job::SetLayersReady.
  void set_ready_end(uint32_t end) { ready_end_ = end; }
  uint32_t in_flight() const { return in_flight_; }
  // The target bytes (tensor offsets of its layout) whose writes it acknowledged.
  const LandedRanges& acked() const { return acked_; }
  // Every chunk's write completed OK, once, and `transfer` counted every byte.
  bool all_landed(const Transfer& transfer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(transfer.mu());
  // The first trouble since the last TakeTrouble, and its status.
  Trouble trouble() const { return trouble_; }
  absl::Status TakeTrouble();

 private:
  struct Entry {
    enum class State : uint8_t { kFree, kParked, kInFlight };
    State state = State::kFree;
    uint16_t seq = 0;
    Chunk chunk;
    sched::Choice choice;
    relay::Slot relay;
  };
  // Posts entry `index`, which holds a chunk and its NIC. False: stop pumping.
  bool Send(uint16_t index, JobEffects* fx);
  // Gives back what entry `index` holds (its NIC reservation, its relay slot) and
  // frees it; `failed` counts a failed write on its NIC.
  void Drop(uint16_t index, bool failed, JobEffects* fx);
  // The NIC of entry `index` does not reach the target: the chunk goes again.
  void LoseNic(uint16_t index, const absl::Status& why, JobEffects* fx);
  void SetTrouble(Trouble trouble, absl::Status status);
  fabric::WriteOp Op(uint16_t index);
  // A reservation on the direct NIC, not a borrowed one (direct_reserved_ counts them).
  bool OnDirect(const sched::Choice& choice) const {
    return !choice.borrowed && choice.nic == direct_nic_;
  }
  // Ends a reservation with the scheduler (Scheduler::Complete's answer).
  int64_t Unreserve(const sched::Choice& choice, uint64_t bytes, bool failed = false);

  const WindowEnv env_;
  const uint32_t job_;
  const int direct_nic_;
  const SourceMemory source_;
  const Prepared target_;
  const std::vector<Extent> extents_;  // before cursor_: the cursor points into it
  ChunkCursor cursor_;
  const uint64_t total_chunks_;  // the cursor's, in all
  uint64_t taken_ = 0;           // of them, handed out by the cursor
  NicReach* const reach_;
  const std::string target_node_;
  uint32_t remote_idle_;
  uint32_t ready_end_ = UINT32_MAX;
  std::vector<Entry> entries_;
  std::vector<uint16_t> free_;
  std::vector<Chunk> again_;  // to send again (failover), or not yet given a NIC
  int parked_ = -1;           // the entry a full queue refused, posted first
  uint32_t in_flight_ = 0;
  uint32_t direct_reserved_ = 0;  // reservations on the direct NIC (not borrowed)
  bool halted_ = false;
  Trouble trouble_ = Trouble::kNone;
  absl::Status trouble_status_;
  LandedRanges acked_;
};

}  // namespace fuselink::transfer
