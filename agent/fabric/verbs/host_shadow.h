// Where a window's bytes land first when they are bound for GPU memory that the NIC
// cannot reach (no dma-buf, no peer memory): pinned host memory holding each extent of
// the window at a place of its own. The NIC writes there through the extent's
// registration; the fabric copies the bytes to the GPU before it delivers the arrival,
// so the GPU memory is written only for a write the window admitted.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/fabric/fabric.h"

namespace fuselink::fabric {

// Where each extent sits in a shadow: extent i at positions[i]. Each place has the
// same offset within its page as the extent's iova (iova_base + offset), because the
// kernel registers an address at an iova only when both agree within the page.
struct ShadowLayout {
  std::vector<uint64_t> positions;
  uint64_t bytes = 0;  // the whole shadow
};
ShadowLayout LayOutShadow(std::span<const Extent> extents, uint64_t iova_base,
                          uint64_t page_bytes);

class HostShadow {
 public:
  using Allocate = std::function<absl::StatusOr<std::shared_ptr<uint8_t>>(uint64_t)>;
  // A shadow of `extents` (sorted, disjoint) for the NICs in `staged_nics` (bit k:
  // NIC k places into the shadow; the others reach the GPU memory themselves).
  static absl::StatusOr<std::shared_ptr<const HostShadow>> Create(
      std::span<const Extent> extents, uint64_t iova_base, uint64_t page_bytes,
      uint64_t staged_nics, const Allocate& allocate);

  uint64_t bytes() const { return layout_.bytes; }
  bool staged_on(int nic) const {
    return nic >= 0 && nic < 64 && (staged_nics_ >> nic) & 1;
  }
  // Where extent i's first byte lands.
  uint8_t* extent_base(size_t i) const { return memory_.get() + layout_.positions[i]; }
  // Where the window's bytes [offset, offset + bytes) landed; null unless one extent
  // holds them all (a NIC places a write through one extent's registration).
  uint8_t* At(uint64_t offset, uint64_t bytes) const;

 private:
  HostShadow(std::vector<Extent> extents, ShadowLayout layout, uint64_t staged_nics,
             std::shared_ptr<uint8_t> memory)
      : extents_(std::move(extents)),
        layout_(std::move(layout)),
        staged_nics_(staged_nics),
        memory_(std::move(memory)) {}

  const std::vector<Extent> extents_;
  const ShadowLayout layout_;
  const uint64_t staged_nics_;
  const std::shared_ptr<uint8_t> memory_;
};

}  // namespace fuselink::fabric
