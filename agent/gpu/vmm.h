// CUDA virtual memory management: physical allocations (cuMemCreate or imported from a
// POSIX fd), address reservations, mappings and access rights, one RAII type each, and
// VmmBuffer, the usual composition of the three. The relay pool remaps granules of a
// staging window with the parts; engines' VMM tensors arrive as fds and are imported.
#pragma once

#include <cstddef>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/gpu/cuda_types.h"
#include "agent/gpu/device.h"

namespace fuselink::gpu {

// `size_bytes` rounded up to a multiple of `granule_bytes`. INVALID_ARGUMENT for zero
// either; OUT_OF_RANGE when the result overflows. Pure.
absl::StatusOr<size_t> RoundUpToGranule(size_t size_bytes, size_t granule_bytes);

// How VmmMemory::Create allocates, beyond the defaults (device memory, exportable as a
// POSIX fd).
struct VmmOptions {
  // Asks for memory a NIC will DMA into (allocFlags.gpuDirectRDMACapable), e.g. through
  // a dma-buf (dmabuf.h) and ibv_reg_dmabuf_mr. Honoured only where the device reports
  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED (the driver API documents
  // the flag only for those), ignored elsewhere: VmmMemory::gpudirect_rdma() says which.
  bool gpudirect_rdma = false;
};

// Minimum VMM granule of the context's device (2 MiB on Hopper) for allocations made
// with `options`: sizes, offsets and addresses of their mappings are multiples of it.
absl::StatusOr<size_t> VmmGranule(const PrimaryContext& context,
                                  const VmmOptions& options = {});

// Physical device memory: cuMemCreate (exportable as a POSIX fd) or
// cuMemImportFromShareableHandle. Released on destruction; memory mapped somewhere
// stays alive until its last mapping goes. Move-only.
class VmmMemory {
 public:
  // `size_bytes` is rounded up to the granule.
  static absl::StatusOr<VmmMemory> Create(const PrimaryContext& context,
                                          size_t size_bytes,
                                          const VmmOptions& options = {});
  // Imports memory another process exported; `size_bytes` is the exporter's allocation
  // size (a granule multiple). INVALID_ARGUMENT with the driver's reason when the fd is
  // not such a handle. The caller keeps `fd` (close it after import).
  static absl::StatusOr<VmmMemory> ImportFd(const PrimaryContext& context, int fd,
                                            size_t size_bytes);
  VmmMemory(VmmMemory&& other) noexcept;
  VmmMemory& operator=(VmmMemory&& other) noexcept;
  ~VmmMemory() { ReportDroppedError(Release()); }

  absl::Status Release();
  // A new POSIX fd for this memory, to pass over a Unix socket (SCM_RIGHTS).
  absl::StatusOr<UniqueFd> ExportFd() const;

  cu::CUmemGenericAllocationHandle handle() const { return handle_; }
  size_t size_bytes() const { return size_bytes_; }
  // Imported: its size is what another process claimed, not what the driver allocated.
  bool imported() const { return imported_; }
  // Created with gpuDirectRDMACapable set (false for imported memory: not known here).
  bool gpudirect_rdma() const { return gpudirect_rdma_; }

 private:
  VmmMemory(const Driver* driver, cu::CUmemGenericAllocationHandle handle,
            size_t size_bytes, bool imported, bool gpudirect_rdma)
      : driver_(driver),
        handle_(handle),
        size_bytes_(size_bytes),
        imported_(imported),
        gpudirect_rdma_(gpudirect_rdma) {}

  const Driver* driver_ = nullptr;
  cu::CUmemGenericAllocationHandle handle_ = 0;
  size_t size_bytes_ = 0;
  bool imported_ = false;
  bool gpudirect_rdma_ = false;
};

// A reserved range of the process's unified virtual address space. Move-only.
class VaReservation {
 public:
  static absl::StatusOr<VaReservation> Reserve(const PrimaryContext& context,
                                               size_t size_bytes, size_t alignment_bytes);
  VaReservation(VaReservation&& other) noexcept;
  VaReservation& operator=(VaReservation&& other) noexcept;
  ~VaReservation() { ReportDroppedError(Free()); }

  absl::Status Free();
  cu::CUdeviceptr ptr() const { return ptr_; }
  size_t size_bytes() const { return size_bytes_; }

 private:
  VaReservation(const Driver* driver, cu::CUdeviceptr ptr, size_t size_bytes)
      : driver_(driver), ptr_(ptr), size_bytes_(size_bytes) {}

  const Driver* driver_ = nullptr;
  cu::CUdeviceptr ptr_ = 0;
  size_t size_bytes_ = 0;
};

// `memory` mapped at `at` (inside a reservation), all of it; unmapped on destruction.
// Grant access with SetAccess before use. Mapping imported memory fails with
// INVALID_ARGUMENT when the size its exporter claimed is wrong. Move-only.
class VmmMapping {
 public:
  static absl::StatusOr<VmmMapping> Map(const PrimaryContext& context, cu::CUdeviceptr at,
                                        const VmmMemory& memory);
  VmmMapping(VmmMapping&& other) noexcept;
  VmmMapping& operator=(VmmMapping&& other) noexcept;
  ~VmmMapping() { ReportDroppedError(Unmap()); }

  absl::Status Unmap();
  cu::CUdeviceptr ptr() const { return ptr_; }
  size_t size_bytes() const { return size_bytes_; }

 private:
  VmmMapping(const Driver* driver, cu::CUdeviceptr ptr, size_t size_bytes)
      : driver_(driver), ptr_(ptr), size_bytes_(size_bytes) {}

  const Driver* driver_ = nullptr;
  cu::CUdeviceptr ptr_ = 0;
  size_t size_bytes_ = 0;
};

// Grants read-write access to [ptr, ptr + size_bytes) to each GPU in `ordinals`.
absl::Status SetAccess(const PrimaryContext& context, cu::CUdeviceptr ptr,
                       size_t size_bytes, std::span<const int> ordinals);

// Physical memory + its own reservation + mapping, read-write for `context`'s GPU and
// any others named. Member order is teardown order: unmap, release, free the range.
class VmmBuffer {
 public:
  // New memory on `context`'s GPU, exportable as a POSIX fd.
  static absl::StatusOr<VmmBuffer> Create(const PrimaryContext& context,
                                          size_t size_bytes,
                                          std::span<const int> also_accessible_by = {},
                                          const VmmOptions& options = {});
  // Memory another process exported as `fd` (of `size_bytes`), mapped read-write on
  // `context`'s GPU. INVALID_ARGUMENT with the driver's reason for a bad fd or size.
  static absl::StatusOr<VmmBuffer> ImportFd(const PrimaryContext& context, int fd,
                                            size_t size_bytes);

  VmmBuffer(VmmBuffer&&) noexcept = default;
  VmmBuffer& operator=(VmmBuffer&&) noexcept = default;

  absl::StatusOr<UniqueFd> ExportFd() const { return memory_.ExportFd(); }
  cu::CUdeviceptr ptr() const { return mapping_.ptr(); }
  size_t size_bytes() const { return memory_.size_bytes(); }
  bool gpudirect_rdma() const { return memory_.gpudirect_rdma(); }

 private:
  static absl::StatusOr<VmmBuffer> MapNew(const PrimaryContext& context, VmmMemory memory,
                                          std::span<const int> accessible_by);
  VmmBuffer(PrimaryContext context, VaReservation range, VmmMemory memory,
            VmmMapping mapping)
      : context_(std::move(context)),
        range_(std::move(range)),
        memory_(std::move(memory)),
        mapping_(std::move(mapping)) {}

  PrimaryContext context_;
  VaReservation range_;
  VmmMemory memory_;
  VmmMapping mapping_;
};

}  // namespace fuselink::gpu
