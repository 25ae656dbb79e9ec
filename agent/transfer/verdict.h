// How a target ends an incoming transfer, as one byte: what a verdict notice carries
// back to the source (imm.h), so that the source's stream, GetTransfer, its metrics
// and the target's watchers all say the same code and reason. The target decides;
// the source reports.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace fuselink::transfer {

enum class Verdict : uint8_t {
  kCompleted = 0,         // OK: every byte of every prepared block landed
  kIncompleteCommit = 1,  // DATA_LOSS: committed with bytes missing
  kSourceIdle = 2,        // UNAVAILABLE: nothing from the source for too long
  kSourceAborted = 3,     // ABORTED: the source said it stopped
  kOwnerExited = 4,       // FAILED_PRECONDITION: the target tensor's lender exited
  kPeerLost = 5,          // UNAVAILABLE: the target lost every connection to the source
  kShuttingDown = 6,      // UNAVAILABLE: the target agent is stopping
  kProtocol = 7,          // INVALID_ARGUMENT: the source's writes broke the protocol
  kTargetFailed = 255,    // INTERNAL: any other failure at the target
};

// The verdict for a status the target ends a slot with (by its reason).
Verdict VerdictOf(const absl::Status& status);
// The status the target's verdict stands for, as the source reports it: the code and
// reason of the verdict, the message naming `target_node`. Any byte is accepted: one
// that names no verdict reads as kTargetFailed.
absl::Status VerdictStatus(uint8_t verdict, absl::string_view target_node);
// The status a target closes a slot with, for `verdict`.
absl::Status TargetStatus(Verdict verdict);

}  // namespace fuselink::transfer
