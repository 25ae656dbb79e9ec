#include "agent/fabric/verbs/host_shadow.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/region_table.h"

namespace fuselink::fabric {

ShadowLayout LayOutShadow(std::span<const Extent> extents, uint64_t iova_base,
                          uint64_t page_bytes) {
  ShadowLayout layout;
  layout.positions.reserve(extents.size());
  uint64_t at = 0;
  for (const Extent& e : extents) {
    const uint64_t want = (iova_base + e.offset) % page_bytes;
    at += (want + page_bytes - at % page_bytes) % page_bytes;
    layout.positions.push_back(at);
    at += e.bytes;
  }
  layout.bytes = at;
  return layout;
}

absl::StatusOr<std::shared_ptr<const HostShadow>> HostShadow::Create(
    std::span<const Extent> extents, uint64_t iova_base, uint64_t page_bytes,
    uint64_t staged_nics, const Allocate& allocate) {
  ShadowLayout layout = LayOutShadow(extents, iova_base, page_bytes);
  // Page-aligned memory, so that each place keeps the offset it was laid out at.
  FL_ASSIGN_OR_RETURN(std::shared_ptr<uint8_t> memory, allocate(layout.bytes));
  if (reinterpret_cast<uintptr_t>(memory.get()) % page_bytes != 0) {
    return absl::InternalError("a window's host shadow is not page-aligned");
  }
  return std::shared_ptr<const HostShadow>(
      new HostShadow(std::vector<Extent>(extents.begin(), extents.end()),
                     std::move(layout), staged_nics, std::move(memory)));
}

uint8_t* HostShadow::At(uint64_t offset, uint64_t bytes) const {
  auto after =
      std::upper_bound(extents_.begin(), extents_.end(), offset,
                       [](uint64_t value, const Extent& e) { return value < e.offset; });
  if (after == extents_.begin()) return nullptr;
  const size_t i = static_cast<size_t>(after - extents_.begin()) - 1;
  const Extent& e = extents_[i];
  if (!ExtentFits(offset - e.offset, bytes, e.bytes)) return nullptr;
  return extent_base(i) + (offset - e.offset);
}

}  // namespace fuselink::fabric
