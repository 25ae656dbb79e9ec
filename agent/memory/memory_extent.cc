#include "agent/memory/memory_extent.h"

#include <algorithm>
#include <tuple>

namespace fuselink::memory {

bool Overlap(const std::vector<MemoryExtent>& a, const std::vector<MemoryExtent>& b) {
  // Sorted by file and start, b's extents are swept once for each of a's file runs:
  // O((n + m) log(n + m)) for tensors of thousands of regions.
  auto sorted = [](std::vector<MemoryExtent> v) {
    std::sort(v.begin(), v.end(), [](const MemoryExtent& x, const MemoryExtent& y) {
      return std::tie(x.file, x.begin) < std::tie(y.file, y.begin);
    });
    return v;
  };
  const std::vector<MemoryExtent> x = sorted(a), y = sorted(b);
  size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const MemoryExtent& p = x[i];
    const MemoryExtent& q = y[j];
    if (p.file != q.file) {
      (p.file < q.file ? i : j)++;
      continue;
    }
    if (p.begin < q.begin + q.bytes && q.begin < p.begin + p.bytes) return true;
    // The one that ends first can overlap nothing further on the other side.
    (p.begin + p.bytes < q.begin + q.bytes ? i : j)++;
  }
  return false;
}

}  // namespace fuselink::memory
