#include "agent/gpu/ipc.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::gpu {

absl::Status CheckSubrange(uint64_t allocation_bytes, uint64_t offset,
                           uint64_t size_bytes) {
  if (size_bytes == 0) return absl::InvalidArgumentError("IPC range of 0 bytes");
  if (offset > allocation_bytes || size_bytes > allocation_bytes - offset) {
    return WithReason(
        absl::OutOfRangeError(absl::StrCat("IPC range [", offset, ", +", size_bytes,
                                           ") leaves the exported allocation of ",
                                           allocation_bytes, " bytes")),
        reasons::kRangeOutsideAllocation);
  }
  return absl::OkStatus();
}

absl::StatusOr<IpcMemHandle> GetIpcMemHandle(const PrimaryContext& context,
                                             cu::CUdeviceptr ptr) {
  DeviceGuard guard(context);
  FL_RETURN_IF_ERROR(guard.status());
  cu::CUipcMemHandle raw{};
  FL_RETURN_IF_ERROR(FL_CU(context.driver(), cuIpcGetMemHandle, &raw, ptr));
  IpcMemHandle handle;
  std::memcpy(handle.data(), raw.reserved, handle.size());
  return handle;
}

absl::StatusOr<IpcImport> IpcImport::Open(const PrimaryContext& context,
                                          const IpcMemHandle& handle, uint64_t offset,
                                          uint64_t size_bytes) {
  if (size_bytes == 0) return absl::InvalidArgumentError("IPC range of 0 bytes");
  FL_ASSIGN_OR_RETURN(PrimaryContext owned, context.Clone());
  DeviceGuard guard(owned);
  FL_RETURN_IF_ERROR(guard.status());
  const Driver& driver = owned.driver();
  cu::CUipcMemHandle raw;
  std::memcpy(raw.reserved, handle.data(), handle.size());
  cu::CUdeviceptr base = 0;
  // Whatever the driver says, the handle the caller sent cannot be used.
  FL_RETURN_IF_ERROR(
      driver.CheckAs(driver.api().cuIpcOpenMemHandle_v2(
                         &base, raw, cu::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                     "cuIpcOpenMemHandle", absl::StatusCode::kInvalidArgument));
  IpcImport opened(std::move(owned), base, 0, 0, 0);  // closes on any error below
  cu::CUdeviceptr range_base = 0;
  size_t allocation_bytes = 0;
  FL_RETURN_IF_ERROR(
      FL_CU(driver, cuMemGetAddressRange_v2, &range_base, &allocation_bytes, base));
  if (range_base != base) {
    return absl::InternalError(
        absl::StrCat("cuIpcOpenMemHandle returned 0x", absl::Hex(base),
                     " inside an allocation starting at 0x", absl::Hex(range_base)));
  }
  FL_RETURN_IF_ERROR(CheckSubrange(allocation_bytes, offset, size_bytes));
  opened.allocation_bytes_ = allocation_bytes;
  opened.offset_ = offset;
  opened.size_bytes_ = size_bytes;
  return opened;
}

IpcImport::IpcImport(IpcImport&& other) noexcept
    : context_(std::move(other.context_)),
      base_(std::exchange(other.base_, 0)),
      allocation_bytes_(std::exchange(other.allocation_bytes_, 0)),
      offset_(std::exchange(other.offset_, 0)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

IpcImport& IpcImport::operator=(IpcImport&& other) noexcept {
  if (this != &other) {
    ReportDroppedError(Close());
    context_ = std::move(other.context_);
    base_ = std::exchange(other.base_, 0);
    allocation_bytes_ = std::exchange(other.allocation_bytes_, 0);
    offset_ = std::exchange(other.offset_, 0);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

absl::Status IpcImport::Close() {
  if (base_ == 0) return absl::OkStatus();
  DeviceGuard guard(context_);
  FL_RETURN_IF_ERROR(guard.status());
  return FL_CU(context_.driver(), cuIpcCloseMemHandle, std::exchange(base_, 0));
}

}  // namespace fuselink::gpu
