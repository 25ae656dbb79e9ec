#include "agent/fabric/region_table.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fuselink::fabric {

absl::StatusOr<RegionKey> RegionTable::Register(void* base, uint64_t bytes,
                                                std::shared_ptr<const void> keepalive,
                                                int gpu) {
  if (base == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("a region needs a base and at least one byte");
  }
  if (!ExtentFits(reinterpret_cast<uintptr_t>(base), bytes,
                  std::numeric_limits<uintptr_t>::max())) {
    return absl::InvalidArgumentError("region wraps around the address space");
  }
  auto region = std::make_shared<const Region>(Region{.base = static_cast<uint8_t*>(base),
                                                      .bytes = bytes,
                                                      .keepalive = std::move(keepalive),
                                                      .gpu = gpu,
                                                      .shadow = nullptr});
  absl::MutexLock lock(&mu_);
  if (regions_.size() >= kMaxRegions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("already ", kMaxRegions, " regions registered"));
  }
  if (next_key_ == std::numeric_limits<RegionKey>::max()) {
    return absl::ResourceExhaustedError("region keys are spent");
  }
  const RegionKey key = next_key_++;
  regions_.emplace(key, std::move(region));
  return key;
}

absl::Status RegionTable::Deregister(RegionKey key) {
  std::shared_ptr<const Region> last;  // released after the lock, outside it
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(key);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("no region with key ", key));
  }
  last = std::move(it->second);
  regions_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Region>> RegionTable::Find(RegionKey key,
                                                                uint64_t offset,
                                                                uint64_t bytes) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = regions_.find(key);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("no region with key ", key));
  }
  if (!ExtentFits(offset, bytes, it->second->bytes)) {
    return absl::OutOfRangeError(absl::StrCat("extent [", offset, ", +", bytes,
                                              ") outside region ", key, " of ",
                                              it->second->bytes, " bytes"));
  }
  return it->second;
}

}  // namespace fuselink::fabric
