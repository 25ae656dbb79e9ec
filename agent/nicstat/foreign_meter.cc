#include "agent/nicstat/foreign_meter.h"

#include <algorithm>

namespace fuselink::nicstat {

uint64_t ForeignMeter::Update(uint64_t kernel_bytes, uint64_t own_bytes,
                              uint64_t slack_bytes) {
  if (!primed_) {
    primed_ = true;
    last_kernel_ = kernel_bytes;
    last_own_ = own_bytes;
    return 0;
  }
  // Own counters only grow; a smaller one (never, barring a bug) counts as no change.
  const uint64_t own_delta = own_bytes >= last_own_ ? own_bytes - last_own_ : 0;
  last_own_ = std::max(last_own_, own_bytes);
  if (kernel_bytes < last_kernel_) {
    // A new base: what moved across the reset is unknown, and none of it is counted.
    // D keeps its place relative to L, less our bytes of this look.
    ++resets_;
    last_kernel_ = kernel_bytes;
    d_ -= static_cast<int64_t>(own_delta);
    lower_ = std::min(lower_, d_);
    return 0;
  }
  d_ +=
      static_cast<int64_t>(kernel_bytes - last_kernel_) - static_cast<int64_t>(own_delta);
  last_kernel_ = kernel_bytes;
  const int64_t bound = d_ - static_cast<int64_t>(slack_bytes);
  uint64_t counted = 0;
  if (bound > lower_) {
    counted = static_cast<uint64_t>(bound - lower_);
    lower_ = bound;
  }
  lower_ = std::min(lower_, d_);  // our count ran ahead: follow it down
  total_ += counted;
  return counted;
}

}  // namespace fuselink::nicstat
