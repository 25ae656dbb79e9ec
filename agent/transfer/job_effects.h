// What a job asks of the engine after it handled an event under its transfer's lock:
// the work that must not run under that lock or on the thread that brought the event
// (a fabric poller): waiting for a GPU fence, growing the relay pool, asking the
// target for its verdict, telling streams and metrics. The engine does it all once
// the lock is released.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/container/inlined_vector.h"
#include "absl/time/time.h"
#include "agent/common/errors.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/fabric.h"
#include "agent/memory/registry.h"
#include "agent/relay/pool.h"
#include "agent/transfer/transfer.h"
#include "fuselink/v1/agent.pb.h"

namespace fuselink::transfer {

struct JobEffects {
  // The job reached its final state: the registry, metrics and streams learn it.
  bool finished = false;
  // With `finished`: the request id may start a new attempt (the failure is one a
  // caller retries, or the target never accepted).
  bool free_request_id = false;
  // The job could not post and waits for room (a completion, a relay slot, Kick).
  bool wait = false;
  // Ask the target for its verdict (blocks: on a worker thread), by `query_deadline`.
  bool query = false;
  absl::Time query_deadline;
  // Streams have something new; `progress_only` when only bytes moved.
  bool notify = false;
  bool progress_only = true;
  // A returning owner waited `give_back_ns` for borrowed chunks to leave its NIC.
  int give_back_nic = -1;
  int64_t give_back_ns = 0;
  // NICs whose GPU relay pool should grow a slot (bit k: NIC k).
  uint32_t grow_relay = 0;
  // Relay slots whose copy may still run (their write never waited on the fence):
  // released once their fence has passed.
  absl::InlinedVector<relay::Slot, 2> release_after_fence;
  // With `finished`, for metrics: how it ended, how long it ran, its bytes.
  State final_state = State::kFailed;
  absl::Duration elapsed;
  uint64_t total_bytes = 0;
  // The source tensor's lease, let go of with no lock held and before the streams
  // and metrics hear the transfer ended.
  memory::TensorLease released;
  // With `finished`: the event for the source's outgoing watches.
  std::optional<v1::WatchEvent> outgoing;
  // A NIC's connection to the target was found failed (a write or notice failed
  // over): the node may re-open it now rather than at its next periodic repair.
  bool nic_lost = false;
  // A write to the target went unacknowledged for the fabric's whole ACK bound: set by
  // the window; the job then asks the target whether it still answers (`probe`).
  bool target_silent = false;
  // Ask the target, by `probe_deadline`, whether its agent still answers (blocks: on
  // a worker thread); the job posts nothing until the answer (Job::OnProbeReply).
  bool probe = false;
  absl::Time probe_deadline;

  // A NIC's connection to the target failed `why`: sets nic_lost, and target_silent
  // when it closed for want of an ACK.
  void NoteNicLost(const absl::Status& why) {
    nic_lost = true;
    if (ReasonOf(why) == reasons::kFabricAckTimeout) target_silent = true;
  }
  // A decided job's writes outlived JobOptions::drain_bound: close the connections to
  // this peer, which fails them (and every other write to it).
  std::optional<fabric::PeerId> disconnect;
};

}  // namespace fuselink::transfer
