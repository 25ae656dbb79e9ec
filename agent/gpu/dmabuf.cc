#include "agent/gpu/dmabuf.h"

#include <unistd.h>

#include <cerrno>
#include <limits>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::gpu {

absl::StatusOr<PageRange> AlignedRange(uint64_t address, uint64_t bytes,
                                       uint64_t page_bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("dma-buf range of 0 bytes");
  if (page_bytes == 0) return absl::InvalidArgumentError("dma-buf page of 0 bytes");
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  if (bytes > kMax - address) {
    return absl::OutOfRangeError(absl::StrCat("dma-buf range of ", bytes, " bytes at 0x",
                                              absl::Hex(address),
                                              " passes the end of the address space"));
  }
  const uint64_t end = address + bytes;
  const uint64_t tail = end % page_bytes;
  if (tail != 0 && page_bytes - tail > kMax - end) {
    return absl::OutOfRangeError(absl::StrCat("dma-buf range ending at 0x",
                                              absl::Hex(end),
                                              " passes the end of the address space "
                                              "when rounded to pages of ",
                                              page_bytes, " bytes"));
  }
  const uint64_t aligned_end = tail == 0 ? end : end + (page_bytes - tail);
  PageRange range;
  range.offset = address % page_bytes;
  range.base = address - range.offset;
  range.bytes = aligned_end - range.base;
  return range;
}

absl::Status DmabufExportAvailable(const DriverApi& api) {
  if (api.cuMemGetHandleForAddressRange != nullptr) return absl::OkStatus();
  return WithReason(absl::UnimplementedError(
                        "dma-buf export needs cuMemGetHandleForAddressRange, which this "
                        "NVIDIA driver lacks (CUDA 11.7+ drivers have it)"),
                    reasons::kNoDmabufExport);
}

absl::StatusOr<bool> DmabufSupported(const PrimaryContext& context) {
  const Driver& driver = context.driver();
  if (!DmabufExportAvailable(driver.api()).ok()) return false;
  int value = 0;
  FL_RETURN_IF_ERROR(FL_CU(driver, cuDeviceGetAttribute, &value,
                           cu::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, context.device()));
  return value != 0;
}

absl::StatusOr<DmabufRange> ExportDmabuf(const PrimaryContext& context, uint64_t address,
                                         uint64_t bytes) {
  const Driver& driver = context.driver();
  FL_RETURN_IF_ERROR(DmabufExportAvailable(driver.api()));
  // The driver takes only ranges whose start and size are multiples of the host page
  // size (cuda.h, CUDA 13.0, cuMemGetHandleForAddressRange: both dptr and size "aligned
  // to host page size"), not of the GPU page or the VMM granule.
  const long page_bytes = sysconf(_SC_PAGESIZE);
  if (page_bytes <= 0) return ErrnoStatus("sysconf(_SC_PAGESIZE)", errno);
  FL_ASSIGN_OR_RETURN(PageRange pages,
                      AlignedRange(address, bytes, static_cast<uint64_t>(page_bytes)));
  FL_ASSIGN_OR_RETURN(bool supported, DmabufSupported(context));
  if (!supported) {
    return WithReason(absl::UnimplementedError(
                          absl::StrCat("GPU ", context.ordinal(),
                                       " cannot export dma-bufs (its driver reports "
                                       "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0)")),
                      reasons::kNoDmabuf);
  }
  DeviceGuard guard(context);
  FL_RETURN_IF_ERROR(guard.status());
  int fd = -1;
  FL_RETURN_IF_ERROR(driver.Check(
      driver.api().cuMemGetHandleForAddressRange(
          &fd, pages.base, pages.bytes, cu::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
      absl::StrCat("cuMemGetHandleForAddressRange of ", pages.bytes, " bytes at 0x",
                   absl::Hex(pages.base), " (GPU ", context.ordinal(), ")")));
  DmabufRange range;
  range.fd = UniqueFd(fd);
  range.offset = pages.offset;
  range.bytes = bytes;
  range.dmabuf_bytes = pages.bytes;
  return range;
}

}  // namespace fuselink::gpu
