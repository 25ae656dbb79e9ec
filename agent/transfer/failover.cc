#include "agent/transfer/failover.h"

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::transfer {
namespace {

// The reasons fabric::RefusalStatus gives: a transport that reports a refusal by its
// status alone is still a refusal.
bool IsRefusalReason(absl::string_view reason) {
  return reason == reasons::kWindowClosed || reason == reasons::kWindowNotYours ||
         reason == reasons::kOutsideWindow;
}

}  // namespace

WriteOutcome ClassifyCompletion(const fabric::Completion& completion) {
  if (completion.status.ok()) return WriteOutcome::kLanded;
  if (completion.refusal != fabric::Refusal::kNone ||
      IsRefusalReason(ReasonOf(completion.status))) {
    return WriteOutcome::kRefused;
  }
  if (absl::IsUnavailable(completion.status)) return WriteOutcome::kNicFault;
  return WriteOutcome::kFailed;
}

PostOutcome ClassifyPost(const absl::Status& posted) {
  if (posted.ok()) return PostOutcome::kPosted;
  if (absl::IsResourceExhausted(posted)) return PostOutcome::kQueueFull;
  if (absl::IsUnavailable(posted)) return PostOutcome::kNicFault;
  return PostOutcome::kFailed;
}

NicReach::NicReach(int nic_count)
    : nic_count_(nic_count),
      mask_(nic_count >= 32 ? ~0u : (uint32_t{1} << nic_count) - 1) {}

bool NicReach::Lose(int nic) {
  if (nic >= 0 && nic < 32) mask_ &= ~(uint32_t{1} << nic);
  return mask_ != 0;
}

int NicReach::NextFrom(int from) const {
  for (int i = 0; i < nic_count_; ++i) {
    const int nic = (from + i) % nic_count_;
    if (mask_ >> nic & 1) return nic;
  }
  return -1;
}

PostOutcome PostNotice(fabric::Fabric& fabric, fabric::PeerId peer, NicReach& reach,
                       int first, uint32_t imm, uint64_t wr_id, int* nic,
                       absl::Status* error) {
  fabric::WriteOp notice;
  notice.imm = imm;
  notice.wr_id = wr_id;
  bool full = false;
  const int nics = reach.nic_count();
  for (int i = 0; i < nics; ++i) {  // each NIC once, from `first`
    const int at = (first + i) % nics;
    if (!(reach.mask() >> at & 1)) continue;
    const absl::Status posted = fabric.PostWrite(peer, at, notice);
    switch (ClassifyPost(posted)) {
      case PostOutcome::kPosted:
        *nic = at;
        return PostOutcome::kPosted;
      case PostOutcome::kQueueFull:
        full = true;
        break;
      case PostOutcome::kNicFault:
        reach.Lose(at);
        break;
      case PostOutcome::kFailed:
        *error = posted;
        return PostOutcome::kFailed;
    }
  }
  return full && !reach.empty() ? PostOutcome::kQueueFull : PostOutcome::kNicFault;
}

absl::Status PeerLostStatus(absl::string_view target_node, const absl::Status& last) {
  return WithReason(absl::UnavailableError(absl::StrCat(
                        "every NIC to node '", BoundedForMessage(target_node),
                        "' failed; last: ", last.message().substr(0, 256))),
                    reasons::kPeerLost);
}

}  // namespace fuselink::transfer
