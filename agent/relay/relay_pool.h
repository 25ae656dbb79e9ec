// Relay slots: where a chunk bound for a borrowed NIC is staged, in memory that
// belongs to that NIC's GPU, so that the NIC sends it from there. Two pools:
//  - RelayPool (here), for host-memory tensors: slots are host memory registered with
//    the fabric, staging is a memcpy. One region per NIC, `slots_per_nic` slots of
//    `slot_bytes` each, allocated once; the regions stay registered for the fabric's
//    life (the fabric holds the memory, so a pool may go before or after its fabric).
//  - GpuRelayPool (gpu_relay_pool.h), for GPU tensors: slots are device memory of the
//    relay GPU, staging crosses NVLink.
// Thread-safe.
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
  // Set when Stage returns before the bytes are in the slot: the write waits for it.
  fabric::Fence* ready = nullptr;
  bool valid() const { return nic >= 0; }
};

// Bytes to stage: host memory, or a device address on `gpu`.
struct Source {
  const uint8_t* data = nullptr;
  int gpu = -1;
};

class Pool {
 public:
  virtual ~Pool() = default;
  // A free slot on `nic`, or an invalid one when none can be had now. May grow the
  // pool (GpuRelayPool: a VMM allocation), so it may block.
  virtual Slot Acquire(int nic) = 0;
  // A free slot on `nic` without growing the pool: never blocks, allocates nothing.
  // What the engine calls on its data path (under a transfer's lock, on fabric
  // threads).
  virtual Slot TryAcquire(int nic) { return Acquire(nic); }
  // Adds a slot on `nic` if the pool may grow there; false when it may not (at its
  // cap, under memory pressure, a failed allocation). Blocks: call it off the data
  // path.
  virtual bool Grow(int nic) { return false; }
  // The slot's bytes must be done with: a slot whose write never waited on slot.ready
  // (it failed first) waits on it before it is released.
  virtual void Release(const Slot& slot) = 0;
  // The relay stage: moves `bytes` from `source` into the slot. Done on return, or,
  // where slot.ready is set, once that fence has passed.
  virtual absl::Status Stage(const Slot& slot, Source source, uint32_t bytes) = 0;
  // NICs that may take borrowed chunks now (bit i: NIC i).
  virtual uint32_t borrowable() const { return ~0u; }
  // Bytes of relay memory held, all NICs together.
  virtual uint64_t held_bytes() const = 0;
};

class RelayPool final : public Pool {
 public:
  static absl::StatusOr<std::unique_ptr<RelayPool>> Create(fabric::Fabric* fabric,
                                                           int nics,
                                                           uint32_t slots_per_nic,
                                                           uint32_t slot_bytes);

  Slot Acquire(int nic) override;
  void Release(const Slot& slot) override;
  // Host memory only: FAILED_PRECONDITION for a GPU source.
  absl::Status Stage(const Slot& slot, Source source, uint32_t bytes) override;
  uint64_t held_bytes() const override;

  uint32_t slot_bytes() const { return slot_bytes_; }

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
