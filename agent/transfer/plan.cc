#include "agent/transfer/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::transfer {

absl::Status ValidateBlocks(const memory::Layout& layout, std::span<const uint32_t> ids,
                            absl::string_view side, bool unique) {
  if (ids.empty()) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(side, ".block_ids is empty")),
        "EMPTY_REQUEST");
  }
  if (ids.size() > kMaxBlocksPerRequest) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          side, ".block_ids has ", ids.size(), " blocks; at most ",
                          kMaxBlocksPerRequest, " per request")),
                      "TOO_MANY_BLOCKS");
  }
  for (uint32_t id : ids) {
    if (id >= layout.blocks_per_layer) {
      return WithReason(absl::OutOfRangeError(
                            absl::StrCat(side, " block ", id, " is outside the tensor's ",
                                         layout.blocks_per_layer, " blocks per layer")),
                        "BLOCK_OUT_OF_RANGE");
    }
  }
  if (unique) {
    std::vector<uint32_t> sorted(ids.begin(), ids.end());
    std::sort(sorted.begin(), sorted.end());
    auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) {
      return WithReason(absl::InvalidArgumentError(
                            absl::StrCat(side, " block ", *dup, " is listed twice")),
                        "DUPLICATE_TARGET_BLOCK");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLayers(const memory::Layout& layout, uint32_t begin, uint32_t end) {
  if (begin >= end || end > layout.layers) {
    return WithReason(absl::OutOfRangeError(absl::StrCat(
                          "layer range [", begin, ", ", end, ") is empty or outside the ",
                          layout.layers, " layers")),
                      "LAYER_OUT_OF_RANGE");
  }
  return absl::OkStatus();
}

std::vector<Extent> PlanExtents(const memory::Layout& source,
                                const memory::Layout& target,
                                std::span<const uint32_t> source_ids,
                                std::span<const uint32_t> target_ids,
                                uint32_t layer_begin, uint32_t layer_end) {
  std::vector<Extent> extents;
  const uint64_t block_bytes = source.block_bytes;
  const bool packed = source.blocks_packed() && target.blocks_packed();
  for (uint32_t layer = layer_begin; layer < layer_end; ++layer) {
    for (size_t i = 0; i < source_ids.size(); ++i) {
      const uint64_t s = source.BlockOffset(layer, source_ids[i]);
      const uint64_t t = target.BlockOffset(layer, target_ids[i]);
      if (packed && i > 0 && source_ids[i] == source_ids[i - 1] + 1 &&
          target_ids[i] == target_ids[i - 1] + 1) {
        extents.back().bytes += block_bytes;
        continue;
      }
      extents.push_back(Extent{layer, s, t, block_bytes});
    }
  }
  return extents;
}

absl::StatusOr<std::vector<fabric::Extent>> BlockRanges(const memory::Layout& layout,
                                                        std::span<const uint32_t> ids,
                                                        uint32_t begin, uint32_t end) {
  const uint64_t pieces = uint64_t{ids.size()} * (end - begin);
  if (pieces > kMaxBlockPieces) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          ids.size(), " blocks x ", end - begin, " layers is over ",
                          kMaxBlockPieces, " block pieces; split the request")),
                      "TOO_FRAGMENTED");
  }
  std::vector<fabric::Extent> ranges;
  ranges.reserve(pieces);
  for (uint32_t layer = begin; layer < end; ++layer) {
    for (uint32_t id : ids) {
      ranges.push_back({layout.BlockOffset(layer, id), layout.block_bytes});
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
  if (ranges.size() > fabric::kMaxWindowExtents) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          "the blocks fall in ", ranges.size(), " separate runs, over ",
                          fabric::kMaxWindowExtents, "; split the request")),
                      "TOO_FRAGMENTED");
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
