#include "agent/gpu/vmm.h"

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::gpu {
namespace {

// Device memory of the context's GPU, exportable as a POSIX fd, marked for GPUDirect
// RDMA when `options` ask for it and the device takes the flag.
absl::StatusOr<cu::CUmemAllocationProp> DeviceProp(const PrimaryContext& context,
                                                   const VmmOptions& options) {
  cu::CUmemAllocationProp prop{};
  prop.type = cu::CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = cu::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = cu::CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = context.ordinal();
  if (options.gpudirect_rdma) {
    int takes_flag = 0;
    FL_RETURN_IF_ERROR(
        FL_CU(context.driver(), cuDeviceGetAttribute, &takes_flag,
              cu::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
              context.device()));
    prop.allocFlags.gpuDirectRDMACapable = takes_flag != 0 ? 1 : 0;
  }
  return prop;
}

absl::StatusOr<size_t> Granule(const Driver& driver,
                               const cu::CUmemAllocationProp& prop) {
  size_t granule = 0;
  FL_RETURN_IF_ERROR(FL_CU(driver, cuMemGetAllocationGranularity, &granule, &prop,
                           cu::CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  return granule;
}

}  // namespace

absl::StatusOr<size_t> RoundUpToGranule(size_t size_bytes, size_t granule_bytes) {
  if (size_bytes == 0) return absl::InvalidArgumentError("VMM size of 0 bytes");
  if (granule_bytes == 0) return absl::InvalidArgumentError("VMM granule of 0 bytes");
  const size_t granules = size_bytes / granule_bytes + (size_bytes % granule_bytes != 0);
  if (granules > std::numeric_limits<size_t>::max() / granule_bytes) {
    return absl::OutOfRangeError(
        absl::StrCat("VMM size ", size_bytes, " overflows when rounded to granules"));
  }
  return granules * granule_bytes;
}

absl::StatusOr<size_t> VmmGranule(const PrimaryContext& context,
                                  const VmmOptions& options) {
  FL_ASSIGN_OR_RETURN(cu::CUmemAllocationProp prop, DeviceProp(context, options));
  return Granule(context.driver(), prop);
}

// --- VmmMemory ---

absl::StatusOr<VmmMemory> VmmMemory::Create(const PrimaryContext& context,
                                            size_t size_bytes,
                                            const VmmOptions& options) {
  DeviceGuard guard(context);
  FL_RETURN_IF_ERROR(guard.status());
  FL_ASSIGN_OR_RETURN(cu::CUmemAllocationProp prop, DeviceProp(context, options));
  FL_ASSIGN_OR_RETURN(size_t granule, Granule(context.driver(), prop));
  FL_ASSIGN_OR_RETURN(size_t rounded, RoundUpToGranule(size_bytes, granule));
  cu::CUmemGenericAllocationHandle handle = 0;
  FL_RETURN_IF_ERROR(FL_CU(context.driver(), cuMemCreate, &handle, rounded, &prop, 0));
  return VmmMemory(&context.driver(), handle, rounded, /*imported=*/false,
                   prop.allocFlags.gpuDirectRDMACapable != 0);
}

absl::StatusOr<VmmMemory> VmmMemory::ImportFd(const PrimaryContext& context, int fd,
                                              size_t size_bytes) {
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat("VMM import of fd ", fd));
  DeviceGuard guard(context);
  FL_RETURN_IF_ERROR(guard.status());
  FL_ASSIGN_OR_RETURN(size_t granule, VmmGranule(context));
  if (size_bytes == 0 || size_bytes % granule != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("VMM import size ", size_bytes,
                     " is not a positive multiple of the granule ", granule));
  }
  cu::CUmemGenericAllocationHandle handle = 0;
  const Driver& driver = context.driver();
  FL_RETURN_IF_ERROR(driver.CheckAs(
      driver.api().cuMemImportFromShareableHandle(
          &handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
          cu::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
      "cuMemImportFromShareableHandle", absl::StatusCode::kInvalidArgument));
  return VmmMemory(&driver, handle, size_bytes, /*imported=*/true,
                   /*gpudirect_rdma=*/false);
}

VmmMemory::VmmMemory(VmmMemory&& other) noexcept
    : driver_(other.driver_),
      handle_(std::exchange(other.handle_, 0)),
      size_bytes_(std::exchange(other.size_bytes_, 0)),
      imported_(other.imported_),
      gpudirect_rdma_(other.gpudirect_rdma_) {}

VmmMemory& VmmMemory::operator=(VmmMemory&& other) noexcept {
  if (this != &other) {
    ReportDroppedError(Release());
    driver_ = other.driver_;
    handle_ = std::exchange(other.handle_, 0);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    imported_ = other.imported_;
    gpudirect_rdma_ = other.gpudirect_rdma_;
  }
  return *this;
}

absl::Status VmmMemory::Release() {
  if (handle_ == 0) return absl::OkStatus();
  return FL_CU(*driver_, cuMemRelease, std::exchange(handle_, 0));
}

absl::StatusOr<UniqueFd> VmmMemory::ExportFd() const {
  if (handle_ == 0) return absl::FailedPreconditionError("export of released VMM memory");
  int fd = -1;
  FL_RETURN_IF_ERROR(FL_CU(*driver_, cuMemExportToShareableHandle, &fd, handle_,
                           cu::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  return UniqueFd(fd);
}

// --- VaReservation ---

absl::StatusOr<VaReservation> VaReservation::Reserve(const PrimaryContext& context,
                                                     size_t size_bytes,
                                                     size_t alignment_bytes) {
  DeviceGuard guard(context);
  FL_RETURN_IF_ERROR(guard.status());
  cu::CUdeviceptr ptr = 0;
  FL_RETURN_IF_ERROR(FL_CU(context.driver(), cuMemAddressReserve, &ptr, size_bytes,
                           alignment_bytes, 0, 0));
  return VaReservation(&context.driver(), ptr, size_bytes);
}

VaReservation::VaReservation(VaReservation&& other) noexcept
    : driver_(other.driver_),
      ptr_(std::exchange(other.ptr_, 0)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

VaReservation& VaReservation::operator=(VaReservation&& other) noexcept {
  if (this != &other) {
    ReportDroppedError(Free());
    driver_ = other.driver_;
    ptr_ = std::exchange(other.ptr_, 0);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

absl::Status VaReservation::Free() {
  if (ptr_ == 0) return absl::OkStatus();
  return FL_CU(*driver_, cuMemAddressFree, std::exchange(ptr_, 0), size_bytes_);
}

// --- VmmMapping ---

absl::StatusOr<VmmMapping> VmmMapping::Map(const PrimaryContext& context,
                                           cu::CUdeviceptr at, const VmmMemory& memory) {
  DeviceGuard guard(context);
  FL_RETURN_IF_ERROR(guard.status());
  const Driver& driver = context.driver();
  const cu::CUresult result =
      driver.api().cuMemMap(at, memory.size_bytes(), 0, memory.handle(), 0);
  // The driver refuses a wrong size of imported memory with various codes (seen on
  // an H200: CUDA_ERROR_NOT_SUPPORTED); to the caller it is a bad size either way.
  FL_RETURN_IF_ERROR(memory.imported()
                         ? driver.CheckAs(result, "cuMemMap of imported memory",
                                          absl::StatusCode::kInvalidArgument)
                         : driver.Check(result, "cuMemMap"));
  return VmmMapping(&context.driver(), at, memory.size_bytes());
}

VmmMapping::VmmMapping(VmmMapping&& other) noexcept
    : driver_(other.driver_),
      ptr_(std::exchange(other.ptr_, 0)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

VmmMapping& VmmMapping::operator=(VmmMapping&& other) noexcept {
  if (this != &other) {
    ReportDroppedError(Unmap());
    driver_ = other.driver_;
    ptr_ = std::exchange(other.ptr_, 0);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

absl::Status VmmMapping::Unmap() {
  if (ptr_ == 0) return absl::OkStatus();
  return FL_CU(*driver_, cuMemUnmap, std::exchange(ptr_, 0), size_bytes_);
}

absl::Status SetAccess(const PrimaryContext& context, cu::CUdeviceptr ptr,
                       size_t size_bytes, std::span<const int> ordinals) {
  std::vector<cu::CUmemAccessDesc> access(ordinals.size());
  for (size_t i = 0; i < ordinals.size(); ++i) {
    access[i].location.type = cu::CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = ordinals[i];
    access[i].flags = cu::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  DeviceGuard guard(context);
  FL_RETURN_IF_ERROR(guard.status());
  return FL_CU(context.driver(), cuMemSetAccess, ptr, size_bytes, access.data(),
               access.size());
}

// --- VmmBuffer ---

absl::StatusOr<VmmBuffer> VmmBuffer::MapNew(const PrimaryContext& context,
                                            VmmMemory memory,
                                            std::span<const int> accessible_by) {
  FL_ASSIGN_OR_RETURN(PrimaryContext owned, context.Clone());
  // The reservation is aligned to the granule of the memory's own properties.
  FL_ASSIGN_OR_RETURN(size_t granule,
                      VmmGranule(owned, {.gpudirect_rdma = memory.gpudirect_rdma()}));
  FL_ASSIGN_OR_RETURN(VaReservation range,
                      VaReservation::Reserve(owned, memory.size_bytes(), granule));
  FL_ASSIGN_OR_RETURN(VmmMapping mapping, VmmMapping::Map(owned, range.ptr(), memory));
  std::vector<int> ordinals = {owned.ordinal()};
  for (int ordinal : accessible_by) {
    if (ordinal != owned.ordinal()) ordinals.push_back(ordinal);
  }
  FL_RETURN_IF_ERROR(SetAccess(owned, mapping.ptr(), mapping.size_bytes(), ordinals));
  return VmmBuffer(std::move(owned), std::move(range), std::move(memory),
                   std::move(mapping));
}

absl::StatusOr<VmmBuffer> VmmBuffer::Create(const PrimaryContext& context,
                                            size_t size_bytes,
                                            std::span<const int> also_accessible_by,
                                            const VmmOptions& options) {
  FL_ASSIGN_OR_RETURN(VmmMemory memory, VmmMemory::Create(context, size_bytes, options));
  return MapNew(context, std::move(memory), also_accessible_by);
}

absl::StatusOr<VmmBuffer> VmmBuffer::ImportFd(const PrimaryContext& context, int fd,
                                              size_t size_bytes) {
  FL_ASSIGN_OR_RETURN(VmmMemory memory, VmmMemory::ImportFd(context, fd, size_bytes));
  return MapNew(context, std::move(memory), {});
}

}  // namespace fuselink::gpu
