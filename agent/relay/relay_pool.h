// Relay slots: where a chunk bound for a borrowed NIC is staged, in memory that
// belongs to that NIC's GPU. On host-memory nodes a slot is pinned host memory
// registered with the fabric and staging is a memcpy; on GPU nodes the slot is
// device memory of the relay GPU and staging is the NVLink copy. One region per NIC,
// `slots_per_nic` slots of `slot_bytes` each, allocated once. The regions stay
// registered for the fabric's life: the fabric holds the memory, so a pool may go
// before or after its fabric. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/fabric/fabric.h"

namespace fuselink::relay {

struct Slot {
  int nic = -1;
  uint32_t index = 0;
  uint8_t* data = nullptr;
  fabric::RegionKey key = 0;
  uint64_t offset = 0;  // of the slot within its region
  bool valid() const { return nic >= 0; }
};

class RelayPool {
 public:
  static absl::StatusOr<std::unique_ptr<RelayPool>> Create(fabric::Fabric* fabric,
                                                           int nics,
                                                           uint32_t slots_per_nic,
                                                           uint32_t slot_bytes);

  // A free slot on `nic`, or an invalid one when all are taken.
  Slot Acquire(int nic);
  void Release(const Slot& slot);
  // The relay stage: moves `bytes` from `source` into the slot.
  void Stage(const Slot& slot, const uint8_t* source, uint32_t bytes);

  uint32_t slot_bytes() const { return slot_bytes_; }
  // Bytes of relay memory held, all NICs together.
  uint64_t held_bytes() const;

 private:
  struct PerNic {
    std::shared_ptr<uint8_t> memory;
    fabric::RegionKey key = 0;
    std::vector<uint32_t> free;  // slot indices
  };
  explicit RelayPool(uint32_t slot_bytes) : slot_bytes_(slot_bytes) {}

  const uint32_t slot_bytes_;
  uint32_t slots_per_nic_ = 0;
  mutable absl::Mutex mu_;
  std::vector<PerNic> nics_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fuselink::relay
