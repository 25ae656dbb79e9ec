// The distinct bytes of a transfer that have landed at its target, as disjoint
// ranges. A chunk written twice (sent again after a NIC failed, or replayed by a
// hostile source) counts once, so "every byte landed" means every byte, not a byte
// count that a duplicate could pad. Pure; not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/btree_map.h"
#include "agent/memory/layout.h"
#include "fuselink/v1/agent.pb.h"

namespace fuselink::transfer {

class LandedRanges {
 public:
  // Adds [offset, offset + bytes); returns how many of those bytes were new.
  uint64_t Add(uint64_t offset, uint64_t bytes);
  // Distinct bytes so far.
  uint64_t bytes() const { return bytes_; }
  // Whether every byte of [offset, offset + bytes) has landed.
  bool Covers(uint64_t offset, uint64_t bytes) const;
  // Disjoint ranges held: writes that landed out of order and have not yet joined.
  size_t ranges() const { return ranges_.size(); }

 private:
  absl::btree_map<uint64_t, uint64_t> ranges_;  // begin -> end, disjoint, not touching
  uint64_t bytes_ = 0;
};

// Which blocks of a transfer landed whole: the layers of [begin, end) in which every
// block did, and the indexes into `ids` of the blocks that did not in some layer.
// `landed` holds tensor offsets of `layout` (the target's).
struct Coverage {
  std::vector<uint32_t> layers_done;
  std::vector<uint32_t> missing;
};
Coverage CoverageOf(const memory::Layout& layout, std::span<const uint32_t> ids,
                    uint32_t begin, uint32_t end, const LandedRanges& landed);

// Fills a watch event's layers_done and failed_block_ids: every layer when `complete`,
// else what CoverageOf finds, naming the blocks by `named` (the ids of the event's
// side, in the order of `ids`, the target's).
void SetCoverage(bool complete, const memory::Layout& layout,
                 std::span<const uint32_t> ids, std::span<const uint32_t> named,
                 uint32_t begin, uint32_t end, const LandedRanges& landed,
                 v1::WatchEvent* event);

}  // namespace fuselink::transfer
