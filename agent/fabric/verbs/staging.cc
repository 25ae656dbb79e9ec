#include "agent/fabric/verbs/staging.h"

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
  // No real device memory, or no NIC to register with: staging only.
  if (!memory.ok() || pd == nullptr) return probe;
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

absl::StatusOr<std::shared_ptr<BouncePool>> BouncePool::Create(
    DeviceStager& stager, int nic, uint32_t count, uint32_t slot_bytes,
    const Registrar& registrar) {
  std::shared_ptr<BouncePool> pool(new BouncePool(slot_bytes));
  pool->buffers_.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    Buffer& buffer = pool->buffers_.emplace_back();
    FL_ASSIGN_OR_RETURN(buffer.memory, stager.AllocatePinned(nic, slot_bytes));
    FL_ASSIGN_OR_RETURN(buffer.mr, registrar(buffer.memory.get(), slot_bytes));
  }
  absl::MutexLock lock(&pool->mu_);
  for (size_t i = 0; i < count; ++i) pool->free_.push_back(i);
  return pool;
}

BouncePool::Registrar BouncePool::LocalReads(ibv_pd* pd) {
  return [pd](uint8_t* data, uint64_t bytes) {
    return RegisterMr(pd, data, bytes, IBV_ACCESS_LOCAL_WRITE);
  };
}

std::shared_ptr<const BouncePool::Slot> BouncePool::Acquire() {
  size_t index = 0;
  {
    absl::MutexLock lock(&mu_, absl::Condition(this, &BouncePool::AnyFree));
    index = free_.back();
    free_.pop_back();
  }
  const Buffer& buffer = buffers_[index];
  // The deleter keeps the pool (and so the slot's memory and MR) alive.
  return std::shared_ptr<const Slot>(
      new Slot{.data = buffer.memory.get(), .lkey = buffer.mr ? buffer.mr->lkey : 0},
      [pool = shared_from_this(), index](const Slot* slot) {
        delete slot;
        pool->Release(index);
      });
}

void BouncePool::Release(size_t index) {
  absl::MutexLock lock(&mu_);
  free_.push_back(index);
}

uint32_t BouncePool::free_slots() {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(free_.size());
}

absl::StatusOr<std::shared_ptr<const BouncePool::Slot>> StageOut(BouncePool& pool,
                                                                 DeviceStage& stage,
                                                                 int gpu, uint64_t from,
                                                                 uint32_t bytes) {
  if (bytes > pool.slot_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a staged write of ", bytes, " bytes: slots hold ", pool.slot_bytes()));
  }
  std::shared_ptr<const BouncePool::Slot> slot = pool.Acquire();
  absl::Status copied = stage.StartToHostAt(gpu, from, slot->data, bytes);
  copied.Update(stage.Wait());  // waited for even when the start failed: none in flight
  // Past its bound the copy may still write the slot: it returns once the copy ends.
  if (absl::IsDeadlineExceeded(copied)) stage.KeepWhileBusy(slot);
  if (!copied.ok()) {
    absl::Status failed = absl::UnavailableError(
        absl::StrCat("staging GPU ", gpu, " memory failed: ", copied.message()));
    // The caller replaces a stage spent by a copy past its bound.
    return absl::IsDeadlineExceeded(copied)
               ? WithReason(std::move(failed), reasons::kGpuCopyTimeout)
               : failed;
  }
  return slot;
}

}  // namespace fuselink::fabric::verbs
