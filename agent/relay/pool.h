// Relay slots: where a GPU tensor's chunk bound for a borrowed NIC is staged, in
// device memory of that NIC's GPU, so that the NIC sends it from there (the copy
// crosses NVLink). The engine sees a Pool; GpuRelayPool (gpu_relay_pool.h) is the
// agent's, tests/transfer/fakes.h has a stand-in. Host tensors need none: every NIC
// reads host memory, so their chunks go straight from the tensor.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
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

}  // namespace fuselink::relay
