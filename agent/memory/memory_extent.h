// What memory a registered region is, as opposed to where this process maps it: how
// the agent tells two registrations of the same bytes apart from two tensors.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace fuselink::memory {

// Where a region's bytes are, independent of where this process maps them: an extent
// of a file (its device and inode, which two mappings of one memfd share) or, with
// `file` {0, 0}, of this process's address space (GPU memory: one import per
// allocation, ipc_imports.h).
struct MemoryExtent {
  std::array<uint64_t, 2> file = {0, 0};
  uint64_t begin = 0;
  uint64_t bytes = 0;
};

// True when some extent of `a` and some extent of `b` share a byte.
bool Overlap(const std::vector<MemoryExtent>& a, const std::vector<MemoryExtent>& b);

// Two indices (the lower first) of extents of `v` that share a byte, if any: the
// regions of one tensor must not (no byte of a tensor in two of its parts).
std::optional<std::pair<size_t, size_t>> SharedWithin(const std::vector<MemoryExtent>& v);

}  // namespace fuselink::memory
