#include "agent/relay/gpu_relay_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/gpu/vmm.h"

namespace fuselink::relay {

absl::StatusOr<StageMode> ParseStageMode(absl::string_view name) {
  if (name == "d1") return StageMode::kKernel;
  if (name == "d2") return StageMode::kCopyEngine;
  return WithReason(
      absl::InvalidArgumentError(absl::StrCat(
          "relay stage '", name, "': choose d1 (kernel) or d2 (copy engine)")),
      reasons::kBadRelayMode);
}

const char* StageModeName(StageMode mode) {
  return mode == StageMode::kKernel ? "d1" : "d2";
}

// One slot's memory, and the fence its writes wait for: an event recorded after the
// last stage into it, on the stream of the GPU that staged it. A wait past the copy
// bound marks the slot stuck: Release quarantines it, Maintain frees it for use once
// the event says the copy ended.
struct GpuRelayPool::SlotMemory final : fabric::Fence {
  SlotMemory(gpu::VmmBuffer buffer, int gpus, gpu::CopyBound* bound)
      : buffer(std::move(buffer)), staged(gpus), bound(bound) {}
  absl::Status Wait() override {
    if (!staged[staged_by].has_value()) return absl::OkStatus();
    if (stuck.load()) {  // waited out once already (by the fabric): not again
      return WithReason(absl::FailedPreconditionError(
                            "an earlier copy into this relay slot has not ended"),
                        reasons::kGpuCopyTimeout);
    }
    gpu::Event& event = *staged[staged_by];
    absl::Status done =
        bound->Wait([&event] { return event.Done(); }, "a copy into a relay slot");
    if (absl::IsDeadlineExceeded(done)) stuck.store(true);
    return done;
  }
  // Whether the last stage into it has ended (never waits).
  bool Ended() {
    if (!staged[staged_by].has_value()) return true;
    absl::StatusOr<bool> done = staged[staged_by]->Done();
    return !done.ok() || *done;  // a failed copy has stopped too
  }

  gpu::VmmBuffer buffer;
  fabric::RegionKey key = 0;
  absl::Time idle_since;
  std::vector<std::optional<gpu::Event>> staged;  // per source GPU, made on first use
  int staged_by = 0;
  gpu::CopyBound* const bound;
  std::atomic<bool> stuck{false};  // a wait timed out: out of use until Ended
};

GpuRelayPool::GpuRelayPool(fabric::Fabric* fabric, const gpu::Runtime* runtime,
                           gpu::CopyBound* bound, std::vector<int> nic_gpu,
                           GpuRelayOptions options)
    : fabric_(fabric),
      runtime_(runtime),
      bound_(bound),
      nic_gpu_(std::move(nic_gpu)),
      options_(options),
      all_gpus_(runtime->count()),
      nics_(nic_gpu_.size()),
      gpus_(runtime->count()) {
  for (int g = 0; g < runtime->count(); ++g) all_gpus_[g] = g;
}

absl::StatusOr<std::unique_ptr<GpuRelayPool>> GpuRelayPool::Create(
    fabric::Fabric* fabric, const gpu::Runtime* runtime, gpu::CopyBound* bound,
    std::vector<int> nic_gpu, GpuRelayOptions options) {
  for (size_t k = 0; k < nic_gpu.size(); ++k) {
    if (!runtime->has(nic_gpu[k])) {
      return absl::FailedPreconditionError(
          absl::StrCat("NIC ", k, "'s GPU ", nic_gpu[k], " is not a GPU of this node"));
    }
  }
  if (options.slot_bytes == 0) return absl::InvalidArgumentError("slot_bytes is 0");
  std::unique_ptr<GpuRelayPool> pool(
      new GpuRelayPool(fabric, runtime, bound, std::move(nic_gpu), options));
  FL_ASSIGN_OR_RETURN(size_t granule, gpu::VmmGranule(runtime->context(0)));
  FL_ASSIGN_OR_RETURN(pool->slot_alloc_bytes_,
                      gpu::RoundUpToGranule(options.slot_bytes, granule));
  for (int g = 0; g < runtime->count(); ++g) {
    auto stager = std::make_unique<Stager>();
    absl::MutexLock lock(&stager->mu);
    FL_ASSIGN_OR_RETURN(stager->stream, gpu::Stream::Create(runtime->context(g)));
    if (options.mode == StageMode::kKernel) {
      FL_ASSIGN_OR_RETURN(stager->kernel, gpu::CopyKernel::Load(runtime->context(g)));
    }
    pool->stagers_.push_back(std::move(stager));
  }
  return pool;
}

bool GpuRelayPool::Grow(int nic) {
  const int g = nic_gpu_[nic];
  {
    absl::MutexLock lock(&mu_);
    PerGpu& per_gpu = gpus_[g];
    if (per_gpu.paused) return false;
    if (!nics_[nic].free.empty()) return true;  // one is free already
    if (per_gpu.held_bytes + slot_alloc_bytes_ > options_.cap_bytes_per_gpu) return false;
    per_gpu.held_bytes += slot_alloc_bytes_;  // reserved against the cap
  }
  // The allocation and mapping run with no lock held: TryAcquire never waits for them.
  // A new slot of whole granules, mapped for every GPU.
  std::shared_ptr<SlotMemory> memory;
  absl::StatusOr<gpu::VmmBuffer> buffer =
      gpu::VmmBuffer::Create(runtime_->context(g), slot_alloc_bytes_, all_gpus_,
                             {.gpudirect_rdma = true});  // a NIC may DMA from it
  if (buffer.ok()) {  // else out of device memory: no borrowing here now
    memory = std::make_shared<SlotMemory>(std::move(*buffer), runtime_->count(), bound_);
    absl::StatusOr<fabric::RegionKey> key =
        fabric_->RegisterDeviceRegion(memory->buffer.ptr(), slot_alloc_bytes_, g, memory);
    if (key.ok()) {
      memory->key = *key;
    } else {
      memory.reset();
    }
  }
  absl::MutexLock lock(&mu_);
  if (memory == nullptr) {
    gpus_[g].held_bytes -= slot_alloc_bytes_;
    return false;
  }
  remaps_.fetch_add(1, std::memory_order_relaxed);
  PerNic& n = nics_[nic];
  auto hole = std::find(n.slots.begin(), n.slots.end(), nullptr);
  const uint32_t index = static_cast<uint32_t>(hole - n.slots.begin());
  if (hole == n.slots.end()) {
    n.slots.push_back(std::move(memory));
  } else {
    *hole = std::move(memory);
  }
  n.free.push_back(index);
  return true;
}

Slot GpuRelayPool::TakeFreeLocked(int nic) {
  PerNic& n = nics_[nic];
  PerGpu& per_gpu = gpus_[nic_gpu_[nic]];
  if (per_gpu.paused || n.free.empty()) return Slot{};
  const uint32_t index = n.free.back();
  n.free.pop_back();
  SlotMemory& memory = *n.slots[index];
  ++per_gpu.in_use;
  return Slot{nic,        index, reinterpret_cast<uint8_t*>(memory.buffer.ptr()),
              memory.key, 0,     &memory};
}

Slot GpuRelayPool::Acquire(int nic) {
  for (;;) {  // grows until a slot is had or the pool may not grow
    if (Slot slot = TryAcquire(nic); slot.valid()) return slot;
    if (!Grow(nic)) return Slot{};
  }
}

Slot GpuRelayPool::TryAcquire(int nic) {
  absl::MutexLock lock(&mu_);
  return TakeFreeLocked(nic);
}

void GpuRelayPool::Release(const Slot& slot) {
  absl::MutexLock lock(&mu_);
  PerNic& n = nics_[slot.nic];
  PerGpu& per_gpu = gpus_[nic_gpu_[slot.nic]];
  SlotMemory& memory = *n.slots[slot.index];
  memory.idle_since = absl::Now();
  --per_gpu.in_use;
  // A copy that timed out may still write it: no chunk goes in until it ends.
  (memory.stuck.load() ? n.quarantined : n.free).push_back(slot.index);
}

void GpuRelayPool::FreeSlotLocked(int nic, uint32_t index,
                                  std::vector<std::shared_ptr<SlotMemory>>* freed) {
  PerNic& n = nics_[nic];
  std::shared_ptr<SlotMemory>& memory = n.slots[index];
  fabric_->DeregisterRegion(memory->key).IgnoreError();
  // Unmapped once the caller drops it with no lock held, and the fabric lets go of its
  // reference once no write uses it.
  freed->push_back(std::move(memory));
  n.free.erase(std::find(n.free.begin(), n.free.end(), index));
  gpus_[nic_gpu_[nic]].held_bytes -= slot_alloc_bytes_;
  remaps_.fetch_add(1, std::memory_order_relaxed);
}

absl::Status GpuRelayPool::Stage(const Slot& slot, Source source, uint32_t bytes) {
  if (!runtime_->has(source.gpu)) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", source.gpu, " is not a GPU of this node"));
  }
  Stager& stager = *stagers_[source.gpu];
  auto& memory =
      static_cast<SlotMemory&>(*slot.ready);  // the slot is ours until released
  std::optional<gpu::Event>& staged = memory.staged[source.gpu];
  if (!staged.has_value()) {
    FL_ASSIGN_OR_RETURN(staged, gpu::Event::Create(runtime_->context(source.gpu), false));
  }
  const auto target = reinterpret_cast<uintptr_t>(slot.data);
  const auto from = reinterpret_cast<uintptr_t>(source.data);
  absl::MutexLock lock(&stager.mu);
  if (stager.kernel.has_value() && (target | from | bytes) % 16 == 0) {
    FL_RETURN_IF_ERROR(stager.kernel->Launch(*stager.stream, target, from, bytes));
    kernel_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  } else {
    FL_RETURN_IF_ERROR(stager.stream->CopyDeviceToDevice(target, from, bytes));
    copy_engine_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  // Not waited for here: the fabric waits on slot.ready before it reads the slot.
  memory.staged_by = source.gpu;
  return staged->Record(*stager.stream);
}

void GpuRelayPool::Maintain(absl::Time now) {
  std::vector<uint64_t> free_bytes(runtime_->count(), ~uint64_t{0});
  for (int g = 0; g < runtime_->count(); ++g) {
    absl::StatusOr<gpu::MemoryInfo> info = gpu::DeviceMemoryInfo(runtime_->context(g));
    if (info.ok()) free_bytes[g] = info->free_bytes;
  }
  std::vector<std::shared_ptr<SlotMemory>> freed;  // unmapped after the lock
  absl::MutexLock lock(&mu_);
  for (int g = 0; g < runtime_->count(); ++g) {
    PerGpu& per_gpu = gpus_[g];
    if (!per_gpu.paused && free_bytes[g] < options_.min_free_bytes) {
      per_gpu.paused = true;
    } else if (per_gpu.paused &&
               free_bytes[g] >= options_.min_free_bytes + options_.cap_bytes_per_gpu) {
      per_gpu.paused = false;
    }
  }
  for (PerNic& n : nics_) {
    std::erase_if(n.quarantined, [&n, now](uint32_t index) {  // those that ended
      SlotMemory& memory = *n.slots[index];
      if (!memory.Ended()) return false;
      memory.stuck.store(false);
      memory.idle_since = now;
      n.free.push_back(index);
      return true;
    });
  }
  for (size_t k = 0; k < nics_.size(); ++k) {
    const bool paused = gpus_[nic_gpu_[k]].paused;
    std::vector<uint32_t> idle;
    for (uint32_t index : nics_[k].free) {
      if (paused || now - nics_[k].slots[index]->idle_since >= options_.idle) {
        idle.push_back(index);
      }
    }
    for (uint32_t index : idle) FreeSlotLocked(static_cast<int>(k), index, &freed);
  }
  UpdateBorrowableLocked();
}

void GpuRelayPool::UpdateBorrowableLocked() {
  uint32_t mask = ~0u;
  for (size_t k = 0; k < nic_gpu_.size(); ++k) {
    if (gpus_[nic_gpu_[k]].paused) mask &= ~(1u << k);
  }
  borrowable_.store(mask, std::memory_order_relaxed);
}

uint64_t GpuRelayPool::held_bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t held = 0;
  for (const PerGpu& g : gpus_) held += g.held_bytes;
  return held;
}

GpuRelayStats GpuRelayPool::stats(int gpu) const {
  absl::MutexLock lock(&mu_);
  const PerGpu& g = gpus_[gpu];
  return GpuRelayStats{g.held_bytes, g.in_use, g.paused};
}

void GpuRelayPool::ReportStats(stats::Sink& sink, int gpus) const {
  using stats::Kind;
  static constexpr stats::Family kDeviceBytes{
      "fuselink_relay_device_bytes",
      "Device memory held for relay slots on the GPU (at most the relay cap).",
      Kind::kGauge};
  static constexpr stats::Family kSlotsInUse{"fuselink_relay_slots_in_use",
                                             "Relay slots on the GPU holding a chunk.",
                                             Kind::kGauge};
  static constexpr stats::Family kPaused{
      "fuselink_relay_paused",
      "1 while the GPU is short of free memory: its relay slots are given back and its "
      "NICs lend nothing.",
      Kind::kGauge};
  static constexpr stats::Family kCap{"fuselink_relay_device_cap_bytes",
                                      "The relay cap per GPU.", Kind::kGauge};
  static constexpr stats::Family kRemaps{
      "fuselink_relay_remaps_total",
      "Relay slot mappings made and unmapped (the pool growing and shrinking).",
      Kind::kCounter};
  static constexpr stats::Family kStaged{"fuselink_relay_staged_bytes_total",
                                         "Bytes staged into GPU relay slots, by way in.",
                                         Kind::kCounter};
  for (int g = 0; g < gpus; ++g) {
    const GpuRelayStats s = stats(g);
    const stats::Labels gpu = {{"gpu", absl::StrCat(g)}};
    sink.Add(kDeviceBytes, gpu, static_cast<double>(s.held_bytes));
    sink.Add(kSlotsInUse, gpu, static_cast<double>(s.slots_in_use));
    sink.Add(kPaused, gpu, s.paused ? 1 : 0);
  }
  sink.Add(kCap, static_cast<double>(options().cap_bytes_per_gpu));
  sink.Add(kRemaps, static_cast<double>(remaps()));
  sink.Add(kStaged, {{"stage", "d1"}}, static_cast<double>(kernel_bytes()));
  sink.Add(kStaged, {{"stage", "d2"}}, static_cast<double>(copy_engine_bytes()));
}

}  // namespace fuselink::relay
