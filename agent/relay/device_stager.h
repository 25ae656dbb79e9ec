// The fabric's DeviceStager on CUDA: each stage has two pinned host buffers on its NIC's
// GPU, a stream per GPU it touches, and (for bytes bound to another GPU) two landing
// buffers on the NIC's GPU. Bytes out of GPU memory are copied by that GPU's stream,
// over its own PCIe link; bytes into GPU memory land on the NIC's GPU first and cross
// NVLink to the target GPU (the receive side of the relay).
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "agent/common/stats.h"
#include "agent/fabric/fabric.h"
#include "agent/gpu/copy_bound.h"
#include "agent/gpu/runtime.h"

namespace fuselink::relay {

class CudaDeviceStager final : public fabric::DeviceStager {
 public:
  // `nic_gpu[k]`: NIC k's GPU, or -1 when it has none here (bytes then go straight
  // between the host buffer and the target GPU). `runtime` and `bound` (every stage's
  // waits) must outlive the stager.
  CudaDeviceStager(const gpu::Runtime* runtime, gpu::CopyBound* bound,
                   std::vector<int> nic_gpu, uint32_t piece_bytes)
      : runtime_(runtime),
        bound_(bound),
        nic_gpu_(std::move(nic_gpu)),
        piece_bytes_(piece_bytes) {}

  absl::StatusOr<std::unique_ptr<fabric::DeviceStage>> NewStage(int nic) override;
  // Portable pinned memory, in NIC `nic`'s GPU's context (GPU 0's without one).
  absl::StatusOr<std::shared_ptr<uint8_t>> AllocatePinned(int nic,
                                                          uint64_t bytes) override;
  // By cuMemGetHandleForAddressRange, where the GPU supports it.
  absl::StatusOr<fabric::DmabufRange> ExportDmabuf(int gpu, uint64_t address,
                                                   uint64_t bytes) override;
  absl::StatusOr<std::shared_ptr<const void>> AllocateProbe(int gpu, uint64_t bytes,
                                                            uint64_t* address) override;

  // Memory the stages hold now (pinned host buffers, landing buffers on GPUs), and
  // the pinned memory of AllocatePinned (verbs bounce slots and window shadows).
  uint64_t pinned_host_bytes() const {
    return held_.host.load(std::memory_order_relaxed);
  }
  uint64_t device_bytes() const { return held_.device.load(std::memory_order_relaxed); }

  struct Held {
    std::atomic<uint64_t> host{0};
    std::atomic<uint64_t> device{0};
  };

  // Device and pinned host memory held for staging.
  void ReportStats(stats::Sink& sink) const;

 private:
  const gpu::Runtime* const runtime_;
  gpu::CopyBound* const bound_;
  const std::vector<int> nic_gpu_;
  const uint32_t piece_bytes_;
  Held held_;
};

}  // namespace fuselink::relay
