// When foreign traffic (bytes on a NIC that fuselink did not move) makes a NIC busy
// for lending, with hysteresis: a pure rule, one state per NIC and direction, driven
// by the agent's foreign-traffic watch (agent/nicstat) at its check cadence.
//
// Busy comes at once: the first look whose foreign rate reaches the threshold makes
// the NIC busy, so that borrowers leave as soon as someone else needs the link (the
// owner rule's promptness). Idle comes slowly: the rate must stay below
// `release_fraction` of the threshold for `hold` without a break. A flow that pauses
// for a moment (TCP slow start after idle, a storage client between requests)
// therefore does not let borrowers back in only to push them out again, and a rate
// hovering at the threshold does not flap: between release and threshold the state
// stays what it was.
#pragma once

#include "absl/time/time.h"

namespace fuselink::sched {

struct ForeignRule {
  // Foreign bytes per second at or above which the NIC is busy; 0: never busy.
  double busy_bytes_per_s = 0;
  // Below this fraction of busy_bytes_per_s ...
  double release_fraction = 0.5;
  // ... for this long without a break, a busy NIC is idle again.
  absl::Duration hold = absl::Milliseconds(300);
};

// Times are a monotonic clock's (nicstat::SteadyNow: time since an arbitrary
// epoch), so that a wall-clock step neither ends a hold early nor stretches it.
struct ForeignState {
  bool busy = false;
  // Since when the rate has been under the release level while busy;
  // InfiniteDuration: it is not.
  absl::Duration quiet_since = absl::InfiniteDuration();
};

// One look: the foreign rate measured at `now`. Returns the new busy state (also in
// `state`).
bool ForeignStep(const ForeignRule& rule, double foreign_bytes_per_s, absl::Duration now,
                 ForeignState& state);

}  // namespace fuselink::sched
