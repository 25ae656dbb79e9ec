// From a request's block lists to the extents and chunks that move them. Pure: no
// I/O, no clocks; unit-tested and benchmarked on its own.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/fabric/fabric.h"
#include "agent/memory/layout.h"

namespace fuselink::transfer {

// Bounds on one request.
inline constexpr size_t kMaxBlocksPerRequest = 1u << 20;
inline constexpr uint32_t kMinChunkBytes = 4096;
inline constexpr uint32_t kMaxChunkBytes = 64u << 20;

// A contiguous run of bytes in one layer, inside one region on each side: source and
// target tensor offsets (memory/layout.h: the region in the top bits).
struct Extent {
  uint32_t layer = 0;
  uint64_t source_offset = 0;
  uint64_t target_offset = 0;
  uint64_t bytes = 0;
};

// One write on the fabric: a piece of an extent no larger than the chunk size.
struct Chunk {
  uint32_t layer = 0;
  uint64_t source_offset = 0;
  uint64_t target_offset = 0;
  uint32_t bytes = 0;
};

// Checks one side's block ids against its layout: non-empty, at most
// kMaxBlocksPerRequest (INVALID_ARGUMENT), each below blocks_per_layer (OUT_OF_RANGE,
// reason BLOCK_OUT_OF_RANGE). `side` ("source", "target") names it in messages.
// With `unique`, a block listed twice is INVALID_ARGUMENT (DUPLICATE_TARGET_BLOCK).
absl::Status ValidateBlocks(const memory::Layout& layout, std::span<const uint32_t> ids,
                            absl::string_view side, bool unique);

// Checks [begin, end) against the layout: OUT_OF_RANGE (LAYER_OUT_OF_RANGE) when
// empty or past the last layer.
absl::Status ValidateLayers(const memory::Layout& layout, uint32_t begin, uint32_t end);

// The extents that move source_ids[i] to target_ids[i] in layers [begin, end), in
// layer order and, within a layer, in ascending target offset (not the lists' order):
// each block's bytes in their parts' order on both sides, cut where either side's part
// ends, runs that continue on both sides joined. The inputs must
// have passed the checks above and have equal block sizes and counts.
std::vector<Extent> PlanExtents(const memory::Layout& source,
                                const memory::Layout& target,
                                std::span<const uint32_t> source_ids,
                                std::span<const uint32_t> target_ids,
                                uint32_t layer_begin, uint32_t layer_end);

// Block pieces (blocks x layers) one side of a request may name, before they are
// joined into runs: bounds the memory a request can make a target spend.
inline constexpr uint64_t kMaxBlockPieces = 1u << 21;

// The byte ranges of a tensor that blocks `ids` fill in layers [begin, end), in tensor
// offsets: sorted, disjoint, touching ranges joined; what a target opens its windows
// over, one per region. The inputs must have passed ValidateBlocks (unique) and
// ValidateLayers. INVALID_ARGUMENT (TOO_FRAGMENTED) past kMaxBlockPieces pieces (blocks
// x layers x parts) or fabric::kMaxWindowExtents runs in one region.
absl::StatusOr<std::vector<fabric::Extent>> BlockRanges(const memory::Layout& layout,
                                                        std::span<const uint32_t> ids,
                                                        uint32_t begin, uint32_t end);

// Walks extents chunk by chunk, each at most `chunk_bytes`. Holds a reference to
// the extents; allocates nothing.
class ChunkCursor {
 public:
  ChunkCursor(std::span<const Extent> extents, uint32_t chunk_bytes)
      : extents_(extents), chunk_bytes_(chunk_bytes) {}
  // The next chunk, or false when every extent is done.
  bool Next(Chunk* chunk);
  bool done() const { return index_ >= extents_.size(); }
  // The layer of the next chunk; only when not done().
  uint32_t next_layer() const { return extents_[index_].layer; }

 private:
  std::span<const Extent> extents_;
  uint32_t chunk_bytes_;
  size_t index_ = 0;
  uint64_t offset_ = 0;  // bytes of extents_[index_] already handed out
};

// Chunks a set of extents makes.
uint64_t CountChunks(std::span<const Extent> extents, uint32_t chunk_bytes);

}  // namespace fuselink::transfer
