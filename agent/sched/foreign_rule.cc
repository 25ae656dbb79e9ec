#include "agent/sched/foreign_rule.h"

namespace fuselink::sched {

bool ForeignStep(const ForeignRule& rule, double foreign_bytes_per_s, absl::Duration now,
                 ForeignState& state) {
  if (rule.busy_bytes_per_s <= 0) {
    state = ForeignState{};
    return false;
  }
  if (foreign_bytes_per_s >= rule.busy_bytes_per_s) {
    state.busy = true;
    state.quiet_since = absl::InfiniteDuration();
    return true;
  }
  if (!state.busy) return false;
  if (foreign_bytes_per_s >= rule.busy_bytes_per_s * rule.release_fraction) {
    state.quiet_since = absl::InfiniteDuration();  // between the two levels: unchanged
    return true;
  }
  if (state.quiet_since == absl::InfiniteDuration()) state.quiet_since = now;
  if (now - state.quiet_since >= rule.hold) {
    state = ForeignState{};
    return false;
  }
  return true;
}

}  // namespace fuselink::sched
