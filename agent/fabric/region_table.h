// Registered memory regions of one fabric, by key. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/fabric/fabric.h"

namespace fuselink::fabric {

class HostShadow;

// Regions one fabric may hold at once; a bound on the table, not on memory.
inline constexpr size_t kMaxRegions = 1 << 20;

// One registered region. Immutable once registered; whoever holds a
// shared_ptr<const Region> keeps the memory alive through `keepalive`.
struct Region {
  // Host memory; for a GPU region, the device address.
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  std::shared_ptr<const void> keepalive;
  int gpu = -1;  // the GPU that holds the memory; -1 for host memory
  bool on_gpu() const { return gpu >= 0; }
  // A verbs window into GPU memory that some NIC cannot reach: where its bytes land
  // first (verbs/host_shadow.h). Null otherwise.
  std::shared_ptr<const HostShadow> shadow;
};

// True when [offset, offset + bytes) lies inside [0, region_bytes), without
// overflowing for any inputs.
constexpr bool ExtentFits(uint64_t offset, uint64_t bytes, uint64_t region_bytes) {
  return offset <= region_bytes && bytes <= region_bytes - offset;
}

class RegionTable {
 public:
  // Keys start at 1 and are never reused; RESOURCE_EXHAUSTED past kMaxRegions
  // regions or once the key space is spent.
  absl::StatusOr<RegionKey> Register(void* base, uint64_t bytes,
                                     std::shared_ptr<const void> keepalive, int gpu = -1);
  // NOT_FOUND for an unknown key. Holders of the region keep it alive.
  absl::Status Deregister(RegionKey key);
  // The region under `key` if [offset, offset + bytes) lies inside it; NOT_FOUND
  // for an unknown key, OUT_OF_RANGE for an extent outside the region. Does not
  // allocate.
  absl::StatusOr<std::shared_ptr<const Region>> Find(RegionKey key, uint64_t offset,
                                                     uint64_t bytes) const;

 private:
  mutable absl::Mutex mu_;
  std::unordered_map<RegionKey, std::shared_ptr<const Region>> regions_
      ABSL_GUARDED_BY(mu_);
  RegionKey next_key_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace fuselink::fabric
