#include "agent/transfer/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"

namespace fuselink::transfer {
namespace {

// PlanExtents' promise: layer by layer, and within a layer in ascending target
// offset with no target byte twice, `bytes` in all (the blocks' bytes per layer).
bool InTargetOrder(std::span<const Extent> extents, uint64_t bytes) {
  uint64_t sum = 0;
  for (size_t i = 0; i < extents.size(); ++i) {
    sum += extents[i].bytes;
    if (i == 0) continue;
    const Extent& a = extents[i - 1];
    const Extent& b = extents[i];
    if (a.layer > b.layer) return false;
    if (a.layer == b.layer && a.target_offset + a.bytes > b.target_offset) return false;
  }
  return sum == bytes;
}

// One block's bytes in layers [begin, end): its parts'.
uint64_t PartBytes(const memory::Layout& layout, uint32_t begin, uint32_t end) {
  uint64_t bytes = 0;
  for (uint32_t layer = begin; layer < end; ++layer) {
    for (uint32_t p = 0; p < layout.part_count(); ++p)
      bytes += layout.part(layer, p).bytes;
  }
  return bytes;
}

// BlockRanges' promise: ascending, disjoint, touching ranges joined.
bool SortedApart(std::span<const fabric::Extent> ranges) {
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].offset + ranges[i - 1].bytes >= ranges[i].offset) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidateBlocks(const memory::Layout& layout, std::span<const uint32_t> ids,
                            absl::string_view side, bool unique) {
  if (ids.empty()) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(side, ".block_ids is empty")),
        reasons::kEmptyRequest);
  }
  if (ids.size() > kMaxBlocksPerRequest) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          side, ".block_ids has ", ids.size(), " blocks; at most ",
                          kMaxBlocksPerRequest, " per request")),
                      reasons::kTooManyBlocks);
  }
  for (uint32_t id : ids) {
    if (id >= layout.blocks_per_layer) {
      return WithReason(absl::OutOfRangeError(
                            absl::StrCat(side, " block ", id, " is outside the tensor's ",
                                         layout.blocks_per_layer, " blocks per layer")),
                        reasons::kBlockOutOfRange);
    }
  }
  if (unique) {
    std::vector<uint32_t> sorted(ids.begin(), ids.end());
    std::sort(sorted.begin(), sorted.end());
    auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) {
      return WithReason(absl::InvalidArgumentError(
                            absl::StrCat(side, " block ", *dup, " is listed twice")),
                        reasons::kDuplicateTargetBlock);
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLayers(const memory::Layout& layout, uint32_t begin, uint32_t end) {
  if (begin >= end || end > layout.layers) {
    return WithReason(absl::OutOfRangeError(absl::StrCat(
                          "layer range [", begin, ", ", end, ") is empty or outside the ",
                          layout.layers, " layers")),
                      reasons::kLayerOutOfRange);
  }
  return absl::OkStatus();
}

namespace {

// Where the parts of the two sides meet in one layer: a block's bytes are its parts'
// in order on each side, so a stretch where neither side changes part is one run.
struct Stretch {
  uint32_t source_part, target_part;
  uint64_t source_skip, target_skip, bytes;  // into the parts
};

void StretchesOf(const memory::Layout& source, const memory::Layout& target,
                 uint32_t layer, std::vector<Stretch>& stretches) {
  stretches.clear();
  uint32_t sp = 0, tp = 0;
  uint64_t s_done = 0, t_done = 0;  // bytes of the current parts behind us
  while (sp < source.part_count() && tp < target.part_count()) {
    const uint64_t s_bytes = source.part(layer, sp).bytes;
    const uint64_t t_bytes = target.part(layer, tp).bytes;
    const uint64_t bytes = std::min(s_bytes - s_done, t_bytes - t_done);
    stretches.push_back({sp, tp, s_done, t_done, bytes});
    s_done += bytes;
    t_done += bytes;
    if (s_done == s_bytes) {
      ++sp;
      s_done = 0;
    }
    if (t_done == t_bytes) {
      ++tp;
      t_done = 0;
    }
  }
}

}  // namespace

std::vector<Extent> PlanExtents(const memory::Layout& source,
                                const memory::Layout& target,
                                std::span<const uint32_t> source_ids,
                                std::span<const uint32_t> target_ids,
                                uint32_t layer_begin, uint32_t layer_end) {
  std::vector<Extent> extents;
  // Appends a run, joined to the last one when both sides continue it.
  auto add = [&](const Extent& run) {
    if (!extents.empty()) {
      Extent& last = extents.back();
      if (last.layer == run.layer &&
          last.source_offset + last.bytes == run.source_offset &&
          last.target_offset + last.bytes == run.target_offset) {
        last.bytes += run.bytes;
        return;
      }
    }
    extents.push_back(run);
  };
  std::vector<Stretch> stretches;
  // One layer's runs before they are sorted and joined.
  std::vector<Extent> runs;
  runs.reserve(source_ids.size());
  for (uint32_t layer = layer_begin; layer < layer_end; ++layer) {
    StretchesOf(source, target, layer, stretches);
    runs.clear();
    for (const Stretch& x : stretches) {
      for (size_t i = 0; i < source_ids.size(); ++i) {
        runs.push_back(Extent{
            layer, source.PartOffset(layer, x.source_part, source_ids[i]) + x.source_skip,
            target.PartOffset(layer, x.target_part, target_ids[i]) + x.target_skip,
            x.bytes});
      }
    }
    // In the target's order, whatever the order of the request's lists (an engine's
    // free list hands out blocks in any order): the bytes then land at the target
    // front to back within the layer and join as they land, so its landed ranges
    // (landed_ranges.h) stay few. The target refuses a block listed twice
    // (ValidateBlocks), so target offsets are unique and the order total.
    std::sort(runs.begin(), runs.end(), [](const Extent& a, const Extent& b) {
      return a.target_offset < b.target_offset;
    });
    for (const Extent& run : runs) add(run);
  }
  FL_DCHECK(InTargetOrder(extents,
                          source_ids.size() * PartBytes(source, layer_begin, layer_end)),
            "a plan out of target order, or not every block's bytes once");
  return extents;
}

absl::StatusOr<std::vector<fabric::Extent>> BlockRanges(const memory::Layout& layout,
                                                        std::span<const uint32_t> ids,
                                                        uint32_t begin, uint32_t end) {
  const uint64_t pieces = uint64_t{ids.size()} * (end - begin) * layout.part_count();
  if (pieces > kMaxBlockPieces) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(
            ids.size(), " blocks x ", end - begin, " layers x ", layout.part_count(),
            " parts is over ", kMaxBlockPieces, " block pieces; split the request")),
        reasons::kTooFragmented);
  }
  std::vector<fabric::Extent> ranges;
  ranges.reserve(pieces);
  for (uint32_t layer = begin; layer < end; ++layer) {
    for (uint32_t p = 0; p < layout.part_count(); ++p) {
      const uint64_t bytes = layout.part(layer, p).bytes;
      for (uint32_t id : ids) ranges.push_back({layout.PartOffset(layer, p, id), bytes});
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const fabric::Extent& a, const fabric::Extent& b) {
              return a.offset < b.offset;
            });
  size_t out = 0;  // join touching ranges in place
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[out].offset + ranges[out].bytes == ranges[i].offset) {
      ranges[out].bytes += ranges[i].bytes;
    } else {
      ranges[++out] = ranges[i];
    }
  }
  ranges.resize(ranges.empty() ? 0 : out + 1);
  FL_DCHECK(SortedApart(ranges), "a target's block ranges overlap or touch");
  // One window per region: each holds at most kMaxWindowExtents runs.
  for (size_t first = 0; first < ranges.size();) {
    const uint32_t region = memory::RegionOf(ranges[first].offset);
    size_t last = first;
    while (last < ranges.size() && memory::RegionOf(ranges[last].offset) == region)
      ++last;
    if (last - first > fabric::kMaxWindowExtents) {
      return WithReason(
          absl::InvalidArgumentError(absl::StrCat(
              "the blocks fall in ", last - first, " separate runs of region ", region,
              ", over ", fabric::kMaxWindowExtents, "; split the request")),
          reasons::kTooFragmented);
    }
    first = last;
  }
  ranges.shrink_to_fit();
  return ranges;
}

bool ChunkCursor::Next(Chunk* chunk) {
  if (index_ >= extents_.size()) return false;
  const Extent& e = extents_[index_];
  const uint64_t bytes = std::min<uint64_t>(chunk_bytes_, e.bytes - offset_);
  *chunk = Chunk{e.layer, e.source_offset + offset_, e.target_offset + offset_,
                 static_cast<uint32_t>(bytes)};
  offset_ += bytes;
  if (offset_ == e.bytes) {
    ++index_;
    offset_ = 0;
  }
  return true;
}

uint64_t CountChunks(std::span<const Extent> extents, uint32_t chunk_bytes) {
  uint64_t chunks = 0;
  for (const Extent& e : extents) chunks += (e.bytes + chunk_bytes - 1) / chunk_bytes;
  return chunks;
}

}  // namespace fuselink::transfer
