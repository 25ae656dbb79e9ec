// GPU memory exported as a Linux dma-buf, for a NIC to register with ibv_reg_dmabuf_mr
// (GPUDirect RDMA without the nvidia-peermem module). The driver exports page-aligned
// ranges only; ExportDmabuf exports the smallest such range around the caller's bytes
// and says where they lie in it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/gpu/cuda_types.h"
#include "agent/gpu/device.h"
#include "agent/gpu/driver.h"

namespace fuselink::gpu {

// The smallest range of whole pages that covers [address, address + bytes).
struct PageRange {
  uint64_t base = 0;    // `address` rounded down to a page
  uint64_t bytes = 0;   // a multiple of the page
  uint64_t offset = 0;  // address - base
};

// The page range around [address, address + bytes) for pages of `page_bytes`.
// INVALID_ARGUMENT for zero bytes or a zero page; OUT_OF_RANGE when the range or its
// rounding passes the end of the 64-bit address space. Pure.
absl::StatusOr<PageRange> AlignedRange(uint64_t address, uint64_t bytes,
                                       uint64_t page_bytes);

// OK when `api` has cuMemGetHandleForAddressRange (CUDA 11.7+ drivers); otherwise
// UNIMPLEMENTED, reason NO_DMABUF_EXPORT: the caller falls back to a host bounce.
absl::Status DmabufExportAvailable(const DriverApi& api);

// Whether memory of the context's GPU can be exported as a dma-buf: the driver has the
// entry point and the device CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED. False (not an
// error) without the entry point, so that drivers too old to know the attribute answer.
absl::StatusOr<bool> DmabufSupported(const PrimaryContext& context);

// An exported range. The caller registers (fd, offset, bytes): ibv_reg_dmabuf_mr(pd,
// offset, bytes, iova, fd.get(), access) reaches exactly the bytes asked for. The fd is
// the caller's; close it once registered (the MR keeps its own reference). The memory
// must stay allocated and mapped while the fd or an MR on it lives: the export does not
// keep it alive, and new memory mapped at the same addresses needs a new export.
struct DmabufRange {
  UniqueFd fd;
  uint64_t offset = 0;        // of the asked-for bytes inside the dma-buf
  uint64_t bytes = 0;         // as asked for
  uint64_t dmabuf_bytes = 0;  // of the whole dma-buf: page multiple, >= offset + bytes
};

// Exports the host pages around [address, address + bytes) of `context`'s GPU as a
// dma-buf. The range must be cuMemAlloc memory (DeviceBuffer) or a fully mapped VMM
// range (VmmBuffer) whose memory has one device and one set of allocation properties;
// its page-rounded ends must stay inside such memory.
// Errors: UNIMPLEMENTED (reason NO_DMABUF_EXPORT) without the entry point, (reason
// NO_DMABUF) where the GPU lacks dma-buf support; INVALID_ARGUMENT for zero bytes;
// OUT_OF_RANGE past the address space's end; a range the driver refuses (a host
// pointer, a freed range) with the code CodeForCuResult gives its answer, the message
// naming the call and the page range, the reason the CUDA error's name.
absl::StatusOr<DmabufRange> ExportDmabuf(const PrimaryContext& context, uint64_t address,
                                         uint64_t bytes);

}  // namespace fuselink::gpu
