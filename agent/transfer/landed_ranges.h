// The distinct bytes of a transfer that have landed at its target, as disjoint
// ranges. A chunk written twice (sent again after a NIC failed, or replayed by a
// hostile source) counts once, so "every byte landed" means every byte, not a byte
// count that a duplicate could pad. Pure; not thread-safe.
#pragma once

#include <cstdint>

#include "absl/container/btree_map.h"

namespace fuselink::transfer {

class LandedRanges {
 public:
  // Adds [offset, offset + bytes); returns how many of those bytes were new.
  uint64_t Add(uint64_t offset, uint64_t bytes);
  // Distinct bytes so far.
  uint64_t bytes() const { return bytes_; }
  // Disjoint ranges held: writes that landed out of order and have not yet joined.
  size_t ranges() const { return ranges_.size(); }

 private:
  absl::btree_map<uint64_t, uint64_t> ranges_;  // begin -> end, disjoint, not touching
  uint64_t bytes_ = 0;
};

}  // namespace fuselink::transfer
