// What a write's answer means for its transfer (docs/design.md, "Failover,
// refusal, back-pressure"):
//  - a transport fault (UNAVAILABLE) is that NIC's alone: the NIC leaves this
//    transfer's reach and the chunk goes again on another; only when no NIC is left is
//    the target lost (PEER_LOST);
//  - a refusal is the target's decision about this transfer: no NIC is to blame, the
//    connection and the other transfers on it go on, and the transfer ends with the
//    target's verdict;
//  - a full queue (RESOURCE_EXHAUSTED from PostWrite) is a delay, never a failure.
// Pure; unit-tested in tests/transfer/engine_parts_test.cc.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "agent/fabric/fabric.h"

namespace fuselink::transfer {

enum class WriteOutcome {
  kLanded,    // the bytes are placed at the target
  kRefused,   // the target refused the write; nothing placed, the NIC is fine
  kNicFault,  // the transport failed: the bytes may or may not have landed
  kFailed,    // anything else (a device fault under the source): the transfer fails
};
WriteOutcome ClassifyCompletion(const fabric::Completion& completion);

enum class PostOutcome {
  kPosted,
  kQueueFull,  // try again once something completes
  kNicFault,   // the NIC does not reach the peer now
  kFailed,     // a write the fabric cannot take at all (a bug here): fail the transfer
};
PostOutcome ClassifyPost(const absl::Status& posted);

// The NICs one transfer may still use to reach its target, bit k for NIC k.
class NicReach {
 public:
  explicit NicReach(int nic_count);
  uint32_t mask() const { return mask_; }
  bool empty() const { return mask_ == 0; }
  int nic_count() const { return nic_count_; }
  // NIC `nic` does not reach the target any more. False when no NIC is left.
  bool Lose(int nic);
  // The first usable NIC at or after `from`, cyclically; -1 when none is left.
  int NextFrom(int from) const;

 private:
  int nic_count_;
  uint32_t mask_;
};

// Posts a zero-byte notice `imm` to `peer` on the first NIC of `reach` from `first`
// that takes it; NICs that fault on the way leave `reach`. kQueueFull when no NIC took
// it and one was only full; kNicFault when none is left; kFailed with `*error` set.
// `*nic` gets the NIC that took it.
PostOutcome PostNotice(fabric::Fabric& fabric, fabric::PeerId peer, NicReach& reach,
                       int first, uint32_t imm, uint64_t wr_id, int* nic,
                       absl::Status* error);

// UNAVAILABLE (PEER_LOST): no NIC reaches `target_node`; `last` was the last fault.
absl::Status PeerLostStatus(absl::string_view target_node, const absl::Status& last);

}  // namespace fuselink::transfer
