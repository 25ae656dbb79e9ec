// GPU memory on the verbs fabric: which way each (GPU, NIC) pair moves it, and the
// bounce slots that stage it through host memory where the NIC cannot reach the GPU.
//
// Paths, best first (decided at start-up for every pair, printed):
//  - dma-buf: the GPU range exported as a dma-buf and registered with
//    ibv_reg_dmabuf_mr; the NIC reads and writes GPU memory itself (GPUDirect RDMA).
//  - peer memory: ibv_reg_mr on the device pointer, through the nvidia-peermem module.
//  - staged: writes out of GPU memory are copied into a bounce slot (pinned host memory
//    registered with the NIC) over the GPU's own PCIe link and sent from there; writes
//    into GPU memory land in the window's host shadow (verbs/host_shadow.h) and are
//    copied to the GPU before they are delivered.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/verbs/wrap.h"

namespace fuselink::fabric::verbs {

enum class GpuPath { kNone, kStaged, kPeerMemory, kDmabuf };
absl::string_view GpuPathName(GpuPath path);

// What start-up found for one (GPU, NIC) pair.
struct GpuPathProbe {
  bool dmabuf_registers = false;       // a probe buffer's dma-buf registered on the NIC
  bool peer_memory_registers = false;  // ibv_reg_mr took the device pointer
  bool stager = false;                 // a DeviceStager can copy for it
};
GpuPath ChooseGpuPath(const GpuPathProbe& probe);

// Whether a peer-memory client for NVIDIA GPUs is loaded (nvidia_peermem, or the
// older nv_peer_mem), under `sysfs_root` ("/sys").
bool PeerMemoryLoaded(const std::string& sysfs_root);

// Tries each path on (`gpu`, `pd`) with a probe allocation from `stager`, and says
// what worked. Never fails: a failed probe is a path not taken. A null `pd` (no NIC)
// probes staging only.
GpuPathProbe ProbeGpuPath(DeviceStager* stager, int gpu, ibv_pd* pd, bool peer_memory);

// Bounce slots of one NIC: `count` pinned buffers of `slot_bytes`, each registered
// for local reads by `registrar` (ibv_reg_mr in the NIC's PD; a test stands in for the
// NIC with no registration). Acquire blocks until one is free; a slot returns when
// the last holder of its handle lets go (a write's SendSlot, until the write
// completes). Thread-safe; the pool lives as long as any handle.
class BouncePool : public std::enable_shared_from_this<BouncePool> {
 public:
  struct Slot {
    uint8_t* data = nullptr;
    uint32_t lkey = 0;
  };
  using Registrar = std::function<absl::StatusOr<MemoryRegion>(uint8_t*, uint64_t)>;
  static absl::StatusOr<std::shared_ptr<BouncePool>> Create(DeviceStager& stager, int nic,
                                                            uint32_t count,
                                                            uint32_t slot_bytes,
                                                            const Registrar& registrar);
  // Registers in `pd` for local reads.
  static Registrar LocalReads(ibv_pd* pd);
  uint32_t slot_bytes() const { return slot_bytes_; }
  // A free slot, waiting for one; the handle returns it. Slots come back as the
  // writes holding them complete, also when their QPs close.
  std::shared_ptr<const Slot> Acquire();
  uint32_t free_slots();

 private:
  struct Buffer {
    std::shared_ptr<uint8_t> memory;
    MemoryRegion mr;
  };
  explicit BouncePool(uint32_t slot_bytes) : slot_bytes_(slot_bytes) {}
  void Release(size_t index);
  bool AnyFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !free_.empty(); }

  const uint32_t slot_bytes_;
  std::vector<Buffer> buffers_;  // fixed after Create
  absl::Mutex mu_;
  std::vector<size_t> free_ ABSL_GUARDED_BY(mu_);
};

// Copies [from, from + bytes) of `gpu` into a free slot of `pool` through `stage` and
// waits for the copy (over the GPU's own PCIe link). UNAVAILABLE when the copy fails
// (the slot goes back, or, past the copy bound, is kept by the spent stage until the
// copy ends, and the reason is GPU_COPY_TIMEOUT); INVALID_ARGUMENT past a slot.
absl::StatusOr<std::shared_ptr<const BouncePool::Slot>> StageOut(BouncePool& pool,
                                                                 DeviceStage& stage,
                                                                 int gpu, uint64_t from,
                                                                 uint32_t bytes);

}  // namespace fuselink::fabric::verbs
