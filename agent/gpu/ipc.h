// CUDA IPC: device memory another process allocated with cudaMalloc / cuMemAlloc (what
// PyTorch's caching allocator holds) and exported with cudaIpcGetMemHandle, opened here.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/gpu/cuda_types.h"
#include "agent/gpu/device.h"

namespace fuselink::gpu {

// The 64 bytes of a cudaIpcMemHandle_t (the driver's CUipcMemHandle), as sent on the
// wire by an engine.
using IpcMemHandle = std::array<uint8_t, cu::CU_IPC_HANDLE_SIZE>;

// Checks that [offset, offset + size_bytes) lies inside an allocation of
// `allocation_bytes`: INVALID_ARGUMENT for an empty range, OUT_OF_RANGE past the end or
// on overflow. Pure.
absl::Status CheckSubrange(uint64_t allocation_bytes, uint64_t offset,
                           uint64_t size_bytes);

// The handle of the allocation that contains `ptr` (a cuMemAlloc pointer of this
// process). The handle names the whole allocation, whatever `ptr` points into.
absl::StatusOr<IpcMemHandle> GetIpcMemHandle(const PrimaryContext& context,
                                             cu::CUdeviceptr ptr);

// An opened IPC handle: the exporter's allocation mapped into this process on
// `context`'s GPU (peer access enabled lazily when that is another GPU), restricted to
// the registered [offset, offset + size_bytes). Closed on destruction. The exporter's
// memory stays valid while it is open, even past the exporter's exit. Move-only.
class IpcImport {
 public:
  // INVALID_ARGUMENT with the driver's reason when the handle cannot be opened (bogus,
  // from a process that has freed it, opened twice in this process); OUT_OF_RANGE when
  // the range leaves the allocation (the handle is closed again).
  static absl::StatusOr<IpcImport> Open(const PrimaryContext& context,
                                        const IpcMemHandle& handle, uint64_t offset,
                                        uint64_t size_bytes);
  IpcImport(IpcImport&& other) noexcept;
  IpcImport& operator=(IpcImport&& other) noexcept;
  ~IpcImport() { ReportDroppedError(Close()); }

  absl::Status Close();

  // Start of the registered range (allocation base + offset).
  cu::CUdeviceptr ptr() const { return base_ + offset_; }
  size_t size_bytes() const { return size_bytes_; }
  // The whole allocation the handle named.
  cu::CUdeviceptr allocation_base() const { return base_; }
  size_t allocation_bytes() const { return allocation_bytes_; }

 private:
  IpcImport(PrimaryContext context, cu::CUdeviceptr base, size_t allocation_bytes,
            uint64_t offset, uint64_t size_bytes)
      : context_(std::move(context)),
        base_(base),
        allocation_bytes_(allocation_bytes),
        offset_(offset),
        size_bytes_(size_bytes) {}

  PrimaryContext context_;  // declared first: released after the handle is closed
  cu::CUdeviceptr base_ = 0;
  size_t allocation_bytes_ = 0;
  uint64_t offset_ = 0;
  uint64_t size_bytes_ = 0;
};

}  // namespace fuselink::gpu
