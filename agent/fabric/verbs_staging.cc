#include "agent/fabric/verbs_staging.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::fabric::verbs {

absl::string_view GpuPathName(GpuPath path) {
  switch (path) {
    case GpuPath::kNone:
      return "none";
    case GpuPath::kStaged:
      return "staged";
    case GpuPath::kPeerMemory:
      return "peer-memory";
    case GpuPath::kDmabuf:
      return "dma-buf";
  }
  return "none";
}

GpuPath ChooseGpuPath(const GpuPathProbe& probe) {
  if (probe.dmabuf_registers) return GpuPath::kDmabuf;
  if (probe.peer_memory_registers) return GpuPath::kPeerMemory;
  if (probe.stager) return GpuPath::kStaged;
  return GpuPath::kNone;
}

bool PeerMemoryLoaded(const std::string& sysfs_root) {
  struct stat st;
  for (const char* module : {"nvidia_peermem", "nv_peer_mem"}) {
    if (stat(absl::StrCat(sysfs_root, "/module/", module).c_str(), &st) == 0) return true;
  }
  return false;
}

GpuPathProbe ProbeGpuPath(DeviceStager* stager, int gpu, ibv_pd* pd, bool peer_memory) {
  GpuPathProbe probe;
  if (stager == nullptr) return probe;
  probe.stager = true;
  constexpr uint64_t kProbeBytes = 2 << 20;
  uint64_t address = 0;
  absl::StatusOr<std::shared_ptr<const void>> memory =
      stager->AllocateProbe(gpu, kProbeBytes, &address);
  if (!memory.ok()) return probe;  // no real device memory: staging only
  if (absl::StatusOr<DmabufRange> range = stager->ExportDmabuf(gpu, address, kProbeBytes);
      range.ok()) {
    probe.dmabuf_registers =
        RegisterDmabufMr(pd, range->fd.get(), range->offset, kProbeBytes, address,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
            .ok();
  }
  if (peer_memory) {
    probe.peer_memory_registers =
        RegisterMr(pd, reinterpret_cast<void*>(address), kProbeBytes,
                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
            .ok();
  }
  return probe;
}

absl::StatusOr<std::shared_ptr<BouncePool>> BouncePool::Create(DeviceStager& stager,
                                                               int nic, ibv_pd* pd,
                                                               uint32_t count,
                                                               uint32_t slot_bytes) {
  std::shared_ptr<BouncePool> pool(new BouncePool(slot_bytes));
  pool->buffers_.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    Buffer& buffer = pool->buffers_.emplace_back();
    FL_ASSIGN_OR_RETURN(buffer.memory, stager.AllocatePinned(nic, slot_bytes));
    FL_ASSIGN_OR_RETURN(buffer.mr, RegisterMr(pd, buffer.memory.get(), slot_bytes,
                                              IBV_ACCESS_LOCAL_WRITE));
  }
  absl::MutexLock lock(&pool->mu_);
  for (size_t i = 0; i < count; ++i) pool->free_.push_back(i);
  return pool;
}

std::shared_ptr<const BouncePool::Slot> BouncePool::Acquire() {
  size_t index = 0;
  {
    absl::MutexLock lock(&mu_, absl::Condition(this, &BouncePool::FreeOrStopped));
    if (stopped_) return nullptr;
    index = free_.back();
    free_.pop_back();
  }
  const Buffer& buffer = buffers_[index];
  // The deleter keeps the pool (and so the slot's memory and MR) alive.
  return std::shared_ptr<const Slot>(
      new Slot{.data = buffer.memory.get(), .lkey = buffer.mr->lkey},
      [pool = shared_from_this(), index](const Slot* slot) {
        delete slot;
        pool->Release(index);
      });
}

void BouncePool::Release(size_t index) {
  absl::MutexLock lock(&mu_);
  free_.push_back(index);
}

void BouncePool::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

}  // namespace fuselink::fabric::verbs
