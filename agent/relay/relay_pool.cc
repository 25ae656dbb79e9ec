#include "agent/relay/relay_pool.h"

#include <sys/mman.h>

#include <cstring>

#include "agent/common/status_macros.h"

namespace fuselink::relay {

absl::StatusOr<std::unique_ptr<RelayPool>> RelayPool::Create(fabric::Fabric* fabric,
                                                             int nics,
                                                             uint32_t slots_per_nic,
                                                             uint32_t slot_bytes) {
  std::unique_ptr<RelayPool> pool(new RelayPool(slot_bytes));
  pool->slots_per_nic_ = slots_per_nic;
  absl::MutexLock lock(&pool->mu_);
  const uint64_t bytes = uint64_t{slots_per_nic} * slot_bytes;
  for (int k = 0; k < nics; ++k) {
    PerNic& n = pool->nics_.emplace_back();
    if (bytes == 0) continue;
    void* p =
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return ErrnoStatus("mmap(relay slots)", errno);
    n.memory = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p),
                                        [bytes](uint8_t* m) { munmap(m, bytes); });
    FL_ASSIGN_OR_RETURN(n.key, fabric->RegisterRegion(p, bytes, n.memory));
    for (uint32_t i = 0; i < slots_per_nic; ++i) n.free.push_back(slots_per_nic - 1 - i);
  }
  return pool;
}

Slot RelayPool::Acquire(int nic) {
  absl::MutexLock lock(&mu_);
  PerNic& n = nics_[nic];
  if (n.free.empty()) return Slot{};
  const uint32_t index = n.free.back();
  n.free.pop_back();
  const uint64_t offset = uint64_t{index} * slot_bytes_;
  return Slot{nic, index, n.memory.get() + offset, n.key, offset};
}

void RelayPool::Release(const Slot& slot) {
  absl::MutexLock lock(&mu_);
  nics_[slot.nic].free.push_back(slot.index);
}

absl::Status RelayPool::Stage(const Slot& slot, Source source, uint32_t bytes) {
  if (source.gpu >= 0) {
    return absl::FailedPreconditionError("host relay slots cannot stage GPU memory");
  }
  std::memcpy(slot.data, source.data, bytes);
  return absl::OkStatus();
}

uint64_t RelayPool::held_bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t held = 0;
  for (const PerNic& n : nics_)
    held += n.memory ? uint64_t{slots_per_nic_} * slot_bytes_ : 0;
  return held;
}

}  // namespace fuselink::relay
