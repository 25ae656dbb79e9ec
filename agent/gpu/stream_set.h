// The streams one user of the GPUs copies on (a fabric stage, the in-node lane's
// copier): one per GPU, made on first use on that GPU's primary context. Wait waits,
// within the node's CopyBound, for every stream used since the last Wait.
//
// Once a wait has timed out the set is stuck: it refuses new copies (FAILED_PRECONDITION,
// reason GPU_COPY_TIMEOUT), and its owner keeps the memory the copies touch until
// Idle() says the GPU is done with them (a stage that goes while busy hands its memory
// to KeepUntilIdle). Used by one thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/gpu/copy_bound.h"
#include "agent/gpu/runtime.h"
#include "agent/gpu/stream.h"

namespace fuselink::gpu {

class StreamSet {
 public:
  // `runtime` and `bound` outlive the set.
  StreamSet(const Runtime* runtime, CopyBound* bound)
      : runtime_(runtime),
        bound_(bound),
        streams_(runtime->count()),
        busy_(runtime->count(), false) {}

  // The stream of `gpu`, for a copy the next Wait waits for. FAILED_PRECONDITION where
  // `gpu` is not a GPU here, or the set is stuck.
  absl::StatusOr<Stream*> For(int gpu);
  // Waits for every copy enqueued since the last Wait; the first error. `what` names
  // the copies in a timeout's message.
  absl::Status Wait(absl::string_view what);
  bool stuck() const { return stuck_; }
  // Whether every stream has run all it was given (polls once, never waits).
  bool Idle();

 private:
  const Runtime* const runtime_;
  CopyBound* const bound_;
  std::vector<std::optional<Stream>> streams_;
  std::vector<bool> busy_;  // by GPU: copies enqueued since the last Wait
  bool stuck_ = false;
};

// What a StreamSet's owner calls as it goes, with the memory the set's copies touch:
// where the set is stuck and still busy, keeps `memory` (and the streams) until
// FreeIdleKept finds them idle, counted in kept_bytes(); else lets both go at once.
void KeepUntilIdle(std::unique_ptr<StreamSet> streams, std::shared_ptr<void> memory,
                   uint64_t bytes);
// Frees what is kept and idle now. Never waits: call it periodically (the node's
// housekeeping).
void FreeIdleKept();
uint64_t kept_bytes();

}  // namespace fuselink::gpu
