#include "agent/transfer/landed_ranges.h"

#include <algorithm>

#include "agent/common/check.h"

namespace fuselink::transfer {

uint64_t LandedRanges::Add(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return 0;
  FL_DCHECK(offset + bytes > offset, "a landed range past the end of the offsets");
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
  const auto joined = ranges_.emplace(begin, end).first;
  // Disjoint and never touching: the joined range's neighbours stay apart from it.
  FL_DCHECK(joined == ranges_.begin() || std::prev(joined)->second < begin,
            "a landed range touches the one before it");
  FL_DCHECK(std::next(joined) == ranges_.end() || std::next(joined)->first > end,
            "a landed range touches the one after it");
  FL_DCHECK(covered <= bytes, "more bytes held than were added");
  const uint64_t added = bytes - covered;
  bytes_ += added;
  return added;
}

bool LandedRanges::Covers(uint64_t offset, uint64_t bytes) const {
  if (bytes == 0) return true;
  auto it = ranges_.upper_bound(offset);  // ranges are disjoint and never touch
  if (it == ranges_.begin()) return false;
  --it;
  return it->first <= offset && it->second >= offset + bytes;
}

Coverage CoverageOf(const memory::Layout& layout, std::span<const uint32_t> ids,
                    uint32_t begin, uint32_t end, const LandedRanges& landed) {
  Coverage out;
  std::vector<bool> missing(ids.size(), false);
  for (uint32_t layer = begin; layer < end; ++layer) {
    bool whole = true;
    for (size_t i = 0; i < ids.size(); ++i) {
      for (uint32_t p = 0; p < layout.part_count(); ++p) {
        if (!landed.Covers(layout.PartOffset(layer, p, ids[i]),
                           layout.part(layer, p).bytes)) {
          missing[i] = true;
          whole = false;
          break;
        }
      }
    }
    if (whole) out.layers_done.push_back(layer);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (missing[i]) out.missing.push_back(static_cast<uint32_t>(i));
  }
  return out;
}

void SetCoverage(bool complete, const memory::Layout& layout,
                 std::span<const uint32_t> ids, std::span<const uint32_t> named,
                 uint32_t begin, uint32_t end, const LandedRanges& landed,
                 v1::WatchEvent* event) {
  if (complete) {
    for (uint32_t layer = begin; layer < end; ++layer) event->add_layers_done(layer);
    return;
  }
  FL_DCHECK(named.size() == ids.size(), "a coverage named by another list");
  const Coverage c = CoverageOf(layout, ids, begin, end, landed);
  *event->mutable_layers_done() = {c.layers_done.begin(), c.layers_done.end()};
  for (uint32_t i : c.missing) event->add_failed_block_ids(named[i]);
}

}  // namespace fuselink::transfer
