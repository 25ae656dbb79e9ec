// A bound on waiting for GPU work. The agent's data path never waits for a copy
// without one: a GPU that hangs (an Xid, a wedged copy engine, a relay kernel that never
// gets the SMs) must cost the transfers that used it, not wedge the thread that waits,
// and with it every transfer on that NIC or lane.
//
// A copy past its bound is not stopped (nothing can stop it), so the memory it reads or
// writes must stay out of use until the GPU says the copy is done: each user says how it
// keeps it out (a stage that timed out refuses work and is never freed while busy, a
// relay slot is quarantined, a bounce slot is kept). See docs/design.md, "Bounds".
//
// Thread-safe; one per node (Node::copy_bound_), shared by the stager, the relay pool
// and the in-node copier.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/common/stats.h"

namespace fuselink::gpu {

class CopyBound {
 public:
  // Polls without sleeping for this long (the driver's own wait spins too: a copy of a
  // few MiB is caught within it), then sleeps kNap between polls.
  static constexpr absl::Duration kSpin = absl::Milliseconds(1);
  static constexpr absl::Duration kNap = absl::Microseconds(100);

  explicit CopyBound(absl::Duration bound) : bound_(bound) {}

  // Polls `done` (Stream::Done, Event::Done) until it answers true (OK) or an error
  // (that error), or `bound` passes: DEADLINE_EXCEEDED with the reason
  // GPU_COPY_TIMEOUT, naming `what`, and counted.
  absl::Status Wait(absl::FunctionRef<absl::StatusOr<bool>()> done,
                    absl::string_view what);

  absl::Duration bound() const { return bound_; }
  uint64_t timeouts() const { return timeouts_.load(std::memory_order_relaxed); }
  // fuselink_gpu_copy_timeouts_total.
  void ReportStats(stats::Sink& sink) const;

 private:
  const absl::Duration bound_;
  std::atomic<uint64_t> timeouts_{0};
};

}  // namespace fuselink::gpu
