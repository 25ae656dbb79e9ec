#include "agent/memory/memory_extent.h"

#include <algorithm>
#include <numeric>
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

std::optional<std::pair<size_t, size_t>> SharedWithin(
    const std::vector<MemoryExtent>& v) {
  // In order of file and start, an extent shares a byte with an earlier one of its
  // file exactly when it starts before the furthest end seen so far in that file.
  std::vector<size_t> order(v.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return std::tie(v[x].file, v[x].begin) < std::tie(v[y].file, v[y].begin);
  });
  std::optional<size_t> furthest;  // of the current file, the extent ending last
  for (size_t i : order) {
    const MemoryExtent& e = v[i];
    if (e.bytes == 0) continue;  // no bytes, nothing shared
    if (furthest && v[*furthest].file == e.file) {
      const MemoryExtent& f = v[*furthest];
      if (e.begin < f.begin + f.bytes)
        return std::pair{std::min(i, *furthest), std::max(i, *furthest)};
      if (e.begin + e.bytes <= f.begin + f.bytes) continue;
    }
    furthest = i;
  }
  return std::nullopt;
}

}  // namespace fuselink::memory
