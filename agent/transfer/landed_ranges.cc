#include "agent/transfer/landed_ranges.h"

#include <algorithm>

namespace fuselink::transfer {

uint64_t LandedRanges::Add(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return 0;
  uint64_t begin = offset;
  uint64_t end = offset + bytes;  // callers pass extents inside a region: no overflow
  uint64_t covered = 0;           // bytes of [offset, offset + bytes) already held
  // The first range that could touch [begin, end): the one before begin, if it
  // reaches it.
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= begin) it = prev;
  }
  while (it != ranges_.end() && it->first <= end) {
    const uint64_t overlap_begin = std::max(it->first, offset);
    const uint64_t overlap_end = std::min(it->second, offset + bytes);
    if (overlap_end > overlap_begin) covered += overlap_end - overlap_begin;
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = ranges_.erase(it);
  }
  ranges_.emplace(begin, end);
  const uint64_t added = bytes - covered;
  bytes_ += added;
  return added;
}

}  // namespace fuselink::transfer
