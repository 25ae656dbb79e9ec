#include "agent/gpu/device.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::gpu {
namespace {

absl::StatusOr<cu::CUdevice> GetDevice(const Driver& driver, int ordinal) {
  cu::CUdevice device = 0;
  FL_RETURN_IF_ERROR(FL_CU(driver, cuDeviceGet, &device, ordinal));
  return device;
}

absl::StatusOr<int> Attribute(const Driver& driver, cu::CUdevice device,
                              cu::CUdevice_attribute attribute) {
  int value = 0;
  FL_RETURN_IF_ERROR(FL_CU(driver, cuDeviceGetAttribute, &value, attribute, device));
  return value;
}

}  // namespace

absl::StatusOr<int> DeviceCount(const Driver& driver) {
  int count = 0;
  FL_RETURN_IF_ERROR(FL_CU(driver, cuDeviceGetCount, &count));
  return count;
}

absl::StatusOr<DeviceInfo> QueryDevice(const Driver& driver, int ordinal) {
  FL_ASSIGN_OR_RETURN(cu::CUdevice device, GetDevice(driver, ordinal));
  DeviceInfo info;
  info.ordinal = ordinal;
  char text[256] = {};
  FL_RETURN_IF_ERROR(FL_CU(driver, cuDeviceGetName, text, sizeof(text) - 1, device));
  info.name = text;
  char bus_id[32] = {};
  FL_RETURN_IF_ERROR(
      FL_CU(driver, cuDeviceGetPCIBusId, bus_id, sizeof(bus_id) - 1, device));
  info.pci_bus_id = bus_id;
  size_t total = 0;
  FL_RETURN_IF_ERROR(FL_CU(driver, cuDeviceTotalMem_v2, &total, device));
  info.total_bytes = total;

  struct Flag {
    cu::CUdevice_attribute attribute;
    bool* field;
  };
  const Flag flags[] = {
      {cu::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, &info.unified_addressing},
      {cu::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, &info.vmm},
      {cu::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
       &info.posix_fd_handles},
      {cu::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, &info.gpudirect_rdma},
      {cu::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
       &info.gpudirect_rdma_vmm},
      {cu::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, &info.dma_buf},
  };
  for (const Flag& flag : flags) {
    FL_ASSIGN_OR_RETURN(int value, Attribute(driver, device, flag.attribute));
    *flag.field = value != 0;
  }
  FL_ASSIGN_OR_RETURN(
      info.compute_major,
      Attribute(driver, device, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR));
  FL_ASSIGN_OR_RETURN(
      info.compute_minor,
      Attribute(driver, device, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
  FL_ASSIGN_OR_RETURN(
      info.multiprocessors,
      Attribute(driver, device, cu::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT));
  return info;
}

absl::StatusOr<bool> CanAccessPeer(const Driver& driver, int from, int to) {
  FL_ASSIGN_OR_RETURN(cu::CUdevice from_device, GetDevice(driver, from));
  FL_ASSIGN_OR_RETURN(cu::CUdevice to_device, GetDevice(driver, to));
  int can = 0;
  FL_RETURN_IF_ERROR(FL_CU(driver, cuDeviceCanAccessPeer, &can, from_device, to_device));
  return can != 0;
}

absl::StatusOr<PrimaryContext> PrimaryContext::Retain(const Driver& driver, int ordinal) {
  FL_ASSIGN_OR_RETURN(cu::CUdevice device, GetDevice(driver, ordinal));
  cu::CUcontext context = nullptr;
  FL_RETURN_IF_ERROR(FL_CU(driver, cuDevicePrimaryCtxRetain, &context, device));
  return PrimaryContext(&driver, ordinal, device, context);
}

PrimaryContext::PrimaryContext(PrimaryContext&& other) noexcept
    : driver_(other.driver_),
      ordinal_(other.ordinal_),
      device_(other.device_),
      context_(std::exchange(other.context_, nullptr)) {}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& other) noexcept {
  if (this != &other) {
    ReportDroppedError(Release());
    driver_ = other.driver_;
    ordinal_ = other.ordinal_;
    device_ = other.device_;
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

PrimaryContext::~PrimaryContext() { ReportDroppedError(Release()); }

absl::Status PrimaryContext::Release() {
  if (context_ == nullptr) return absl::OkStatus();
  context_ = nullptr;
  return FL_CU(*driver_, cuDevicePrimaryCtxRelease_v2, device_);
}

DeviceGuard::DeviceGuard(const PrimaryContext& context) : driver_(context.driver()) {
  status_ = FL_CU(driver_, cuCtxGetCurrent, &previous_);
  if (!status_.ok() || previous_ == context.get()) return;
  status_ = FL_CU(driver_, cuCtxSetCurrent, context.get());
  switched_ = status_.ok();
}

DeviceGuard::~DeviceGuard() {
  if (switched_) ReportDroppedError(FL_CU(driver_, cuCtxSetCurrent, previous_));
}

absl::Status EnablePeerAccess(const PrimaryContext& from, const PrimaryContext& to) {
  if (from.ordinal() == to.ordinal()) return absl::OkStatus();
  FL_ASSIGN_OR_RETURN(bool can,
                      CanAccessPeer(from.driver(), from.ordinal(), to.ordinal()));
  if (!can) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "GPU ", from.ordinal(), " cannot access GPU ", to.ordinal(),
                          " as a peer (no NVLink or PCIe P2P path)")),
                      reasons::kNoPeerAccess);
  }
  DeviceGuard guard(from);
  FL_RETURN_IF_ERROR(guard.status());
  const cu::CUresult result = from.driver().api().cuCtxEnablePeerAccess(to.get(), 0);
  if (result == cu::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return absl::OkStatus();
  return from.driver().Check(result, "cuCtxEnablePeerAccess");
}

absl::StatusOr<MemoryInfo> DeviceMemoryInfo(const PrimaryContext& context) {
  DeviceGuard guard(context);
  FL_RETURN_IF_ERROR(guard.status());
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  FL_RETURN_IF_ERROR(FL_CU(context.driver(), cuMemGetInfo_v2, &free_bytes, &total_bytes));
  return MemoryInfo{free_bytes, total_bytes};
}

}  // namespace fuselink::gpu
