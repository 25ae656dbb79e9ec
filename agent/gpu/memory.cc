#include "agent/gpu/memory.h"

#include <utility>

#include "agent/common/status_macros.h"

namespace fuselink::gpu {
namespace {

absl::Status CheckSize(size_t size_bytes) {
  if (size_bytes == 0) return absl::InvalidArgumentError("allocation of 0 bytes");
  return absl::OkStatus();
}

}  // namespace

// --- DeviceBuffer ---

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(const PrimaryContext& context,
                                                    size_t size_bytes) {
  FL_RETURN_IF_ERROR(CheckSize(size_bytes));
  FL_ASSIGN_OR_RETURN(PrimaryContext owned, context.Clone());
  DeviceGuard guard(owned);
  FL_RETURN_IF_ERROR(guard.status());
  cu::CUdeviceptr ptr = 0;
  FL_RETURN_IF_ERROR(FL_CU(owned.driver(), cuMemAlloc_v2, &ptr, size_bytes));
  return DeviceBuffer(std::move(owned), ptr, size_bytes);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : context_(std::move(other.context_)),
      ptr_(std::exchange(other.ptr_, 0)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    ReportDroppedError(Free());
    context_ = std::move(other.context_);
    ptr_ = std::exchange(other.ptr_, 0);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

absl::Status DeviceBuffer::Free() {
  if (ptr_ == 0) return absl::OkStatus();
  DeviceGuard guard(context_);
  FL_RETURN_IF_ERROR(guard.status());
  return FL_CU(context_.driver(), cuMemFree_v2, std::exchange(ptr_, 0));
}

// --- PinnedHostBuffer ---

absl::StatusOr<PinnedHostBuffer> PinnedHostBuffer::Allocate(const PrimaryContext& context,
                                                            size_t size_bytes) {
  FL_RETURN_IF_ERROR(CheckSize(size_bytes));
  FL_ASSIGN_OR_RETURN(PrimaryContext owned, context.Clone());
  DeviceGuard guard(owned);
  FL_RETURN_IF_ERROR(guard.status());
  void* data = nullptr;
  FL_RETURN_IF_ERROR(FL_CU(owned.driver(), cuMemHostAlloc, &data, size_bytes,
                           cu::CU_MEMHOSTALLOC_PORTABLE | cu::CU_MEMHOSTALLOC_DEVICEMAP));
  return PinnedHostBuffer(std::move(owned), data, size_bytes);
}

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : context_(std::move(other.context_)),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    ReportDroppedError(Free());
    context_ = std::move(other.context_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

absl::Status PinnedHostBuffer::Free() {
  if (data_ == nullptr) return absl::OkStatus();
  DeviceGuard guard(context_);
  FL_RETURN_IF_ERROR(guard.status());
  return FL_CU(context_.driver(), cuMemFreeHost, std::exchange(data_, nullptr));
}

// --- HostRegistration ---

absl::StatusOr<HostRegistration> HostRegistration::Register(const PrimaryContext& context,
                                                            void* data,
                                                            size_t size_bytes) {
  FL_RETURN_IF_ERROR(CheckSize(size_bytes));
  if (data == nullptr) return absl::InvalidArgumentError("registering a null pointer");
  FL_ASSIGN_OR_RETURN(PrimaryContext owned, context.Clone());
  DeviceGuard guard(owned);
  FL_RETURN_IF_ERROR(guard.status());
  FL_RETURN_IF_ERROR(
      FL_CU(owned.driver(), cuMemHostRegister_v2, data, size_bytes,
            cu::CU_MEMHOSTREGISTER_PORTABLE | cu::CU_MEMHOSTREGISTER_DEVICEMAP));
  return HostRegistration(std::move(owned), data, size_bytes);
}

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : context_(std::move(other.context_)),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    ReportDroppedError(Unregister());
    context_ = std::move(other.context_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

absl::Status HostRegistration::Unregister() {
  if (data_ == nullptr) return absl::OkStatus();
  DeviceGuard guard(context_);
  FL_RETURN_IF_ERROR(guard.status());
  return FL_CU(context_.driver(), cuMemHostUnregister, std::exchange(data_, nullptr));
}

}  // namespace fuselink::gpu
