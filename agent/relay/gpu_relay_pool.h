// Relay slots on GPUs, for GPU tensors. A chunk bound for borrowed NIC k is staged in a
// slot on NIC k's GPU and the NIC sends it from there: the bytes cross NVLink once and
// then leave through GPU k's PCIe link (or GPUDirect path), not the source GPU's.
//
// Slots are VMM allocations (whole granules) mapped once, readable and writable by every
// GPU of the node, each its own fabric region. The pool grows on demand up to
// `cap_bytes_per_gpu` per relay GPU, frees slots idle longer than `idle`, and when a
// relay GPU's free memory falls under `min_free_bytes` it gives back every slot it can
// and stops lending that GPU's NICs (borrowable()) until free memory is back above
// min_free_bytes + cap_bytes_per_gpu.
//
// Stage only enqueues the copy and records an event; the slot's fence (Slot::ready)
// waits for it on the fabric's thread, so the engine never blocks on the GPU. The
// fence's wait is bounded (gpu/copy_bound.h); a slot whose copy outlived it is
// quarantined when released, and lent again only once the copy has ended.
//
// Two ways into a slot (StageMode):
//  - kKernel (D1): a copy kernel on the source GPU stores through the slot's mapping;
//    chunks not aligned to 16 bytes fall back to the copy engine.
//  - kCopyEngine (D2): a copy-engine peer copy on the source GPU's stream.
// Slots in use when the pool goes stay registered: the fabric holds their memory, as
// with RelayPool. Thread-safe; Stage serialises per source GPU (one stream each).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/stats.h"
#include "agent/fabric/fabric.h"
#include "agent/gpu/copy_bound.h"
#include "agent/gpu/copy_kernel.h"
#include "agent/gpu/runtime.h"
#include "agent/gpu/stream.h"
#include "agent/relay/pool.h"

namespace fuselink::relay {

enum class StageMode { kKernel, kCopyEngine };
// "d1" (kernel) or "d2" (copy engine).
absl::StatusOr<StageMode> ParseStageMode(absl::string_view name);
const char* StageModeName(StageMode mode);

struct GpuRelayOptions {
  StageMode mode = StageMode::kCopyEngine;
  uint32_t slot_bytes = 4 << 20;
  uint64_t cap_bytes_per_gpu = uint64_t{512} << 20;
  uint64_t min_free_bytes = uint64_t{2} << 30;
  absl::Duration idle = absl::Seconds(2);
};

// Counters of one relay GPU.
struct GpuRelayStats {
  uint64_t held_bytes = 0;
  uint64_t slots_in_use = 0;
  bool paused = false;  // under memory pressure: lending its NICs is off
};

class GpuRelayPool final : public Pool {
 public:
  // `nic_gpu[k]`: the GPU of NIC k; every one must be a GPU of `runtime`. `bound`
  // bounds the slots' fences, and outlives the pool.
  static absl::StatusOr<std::unique_ptr<GpuRelayPool>> Create(fabric::Fabric* fabric,
                                                              const gpu::Runtime* runtime,
                                                              gpu::CopyBound* bound,
                                                              std::vector<int> nic_gpu,
                                                              GpuRelayOptions options);

  Slot Acquire(int nic) override;
  Slot TryAcquire(int nic) override;
  // Allocates and maps the slot with mu_ released: TryAcquire never waits for it.
  bool Grow(int nic) override;
  // Under memory pressure the slot is freed at the next Maintain, not here: freeing
  // unmaps device memory, which the engine's data path must not wait for.
  void Release(const Slot& slot) override;
  // `source` must be device memory of a runtime GPU.
  absl::Status Stage(const Slot& slot, Source source, uint32_t bytes) override;
  uint32_t borrowable() const override {
    return borrowable_.load(std::memory_order_relaxed);
  }
  uint64_t held_bytes() const override;

  // Frees idle slots and watches each relay GPU's free memory. Call periodically.
  void Maintain(absl::Time now);

  const GpuRelayOptions& options() const { return options_; }
  GpuRelayStats stats(int gpu) const;
  // Slot mappings made and unmapped since start: the pool's remaps.
  uint64_t remaps() const { return remaps_.load(std::memory_order_relaxed); }
  // Bytes staged by the kernel and by the copy engine.
  uint64_t kernel_bytes() const { return kernel_bytes_.load(std::memory_order_relaxed); }
  uint64_t copy_engine_bytes() const {
    return copy_engine_bytes_.load(std::memory_order_relaxed);
  }

  // Per GPU of the first `gpus`: relay memory held, slots in use, paused; the cap,
  // remaps and bytes staged.
  void ReportStats(stats::Sink& sink, int gpus) const;

 private:
  struct SlotMemory;
  struct PerNic {
    std::vector<std::shared_ptr<SlotMemory>> slots;  // index = Slot::index
    std::vector<uint32_t> free;
    // Released while a copy that timed out may still write them; free once it ends
    // (Maintain).
    std::vector<uint32_t> quarantined;
  };
  struct PerGpu {
    uint64_t held_bytes = 0;
    uint64_t in_use = 0;
    bool paused = false;
  };
  // A source GPU's way into slots: one stream, the kernel in D1.
  struct Stager {
    absl::Mutex mu;
    std::optional<gpu::Stream> stream ABSL_GUARDED_BY(mu);
    std::optional<gpu::CopyKernel> kernel ABSL_GUARDED_BY(mu);
  };

  GpuRelayPool(fabric::Fabric* fabric, const gpu::Runtime* runtime, gpu::CopyBound* bound,
               std::vector<int> nic_gpu, GpuRelayOptions options);
  // Frees slot `index` of `nic` (free, not in use) into `freed`, which the caller
  // drops with mu_ released (the unmap). Caller holds mu_.
  void FreeSlotLocked(int nic, uint32_t index,
                      std::vector<std::shared_ptr<SlotMemory>>* freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a free slot of `nic`, or an invalid one.
  Slot TakeFreeLocked(int nic) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateBorrowableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  fabric::Fabric* const fabric_;
  const gpu::Runtime* const runtime_;
  gpu::CopyBound* const bound_;
  const std::vector<int> nic_gpu_;
  const GpuRelayOptions options_;
  uint64_t slot_alloc_bytes_ = 0;  // slot_bytes rounded up to the granule
  std::vector<int> all_gpus_;      // 0 .. count - 1: every GPU reaches every slot
  std::vector<std::unique_ptr<Stager>> stagers_;  // per source GPU

  mutable absl::Mutex mu_;
  std::vector<PerNic> nics_ ABSL_GUARDED_BY(mu_);
  std::vector<PerGpu> gpus_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint32_t> borrowable_{~0u};
  std::atomic<uint64_t> remaps_{0};
  std::atomic<uint64_t> kernel_bytes_{0};
  std::atomic<uint64_t> copy_engine_bytes_{0};
};

}  // namespace fuselink::relay
