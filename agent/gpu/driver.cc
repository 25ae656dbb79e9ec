#include "agent/gpu/driver.h"

#include <dlfcn.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::gpu {
namespace {

constexpr char kDriverLibrary[] = "libcuda.so.1";

// Resolves one entry point; false when the library lacks it.
template <typename Fn>
bool Resolve(void* library, const char* name, Fn*& slot) {
  slot = reinterpret_cast<Fn*>(dlsym(library, name));
  return slot != nullptr;
}

}  // namespace

absl::StatusCode CodeForCuResult(cu::CUresult result) {
  using absl::StatusCode;
  switch (result) {
    case cu::CUDA_SUCCESS:
      return StatusCode::kOk;
    case cu::CUDA_ERROR_INVALID_VALUE:
    case cu::CUDA_ERROR_INVALID_DEVICE:
    case cu::CUDA_ERROR_INVALID_HANDLE:
    case cu::CUDA_ERROR_INVALID_IMAGE:
    case cu::CUDA_ERROR_INVALID_PTX:
    case cu::CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
    case cu::CUDA_ERROR_NO_BINARY_FOR_GPU:
    case cu::CUDA_ERROR_NOT_MAPPED:
    case cu::CUDA_ERROR_ALREADY_MAPPED:
    case cu::CUDA_ERROR_MAP_FAILED:
    case cu::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
      return StatusCode::kInvalidArgument;
    case cu::CUDA_ERROR_NOT_FOUND:
    case cu::CUDA_ERROR_FILE_NOT_FOUND:
      return StatusCode::kNotFound;
    case cu::CUDA_ERROR_OUT_OF_MEMORY:
    case cu::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
    case cu::CUDA_ERROR_TOO_MANY_PEERS:
      return StatusCode::kResourceExhausted;
    case cu::CUDA_ERROR_NOT_READY:
    case cu::CUDA_ERROR_DEVICE_UNAVAILABLE:
    case cu::CUDA_ERROR_SYSTEM_NOT_READY:
    case cu::CUDA_ERROR_TIMEOUT:
      return StatusCode::kUnavailable;
    case cu::CUDA_ERROR_NOT_INITIALIZED:
    case cu::CUDA_ERROR_DEINITIALIZED:
    case cu::CUDA_ERROR_STUB_LIBRARY:
    case cu::CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    case cu::CUDA_ERROR_NO_DEVICE:
    case cu::CUDA_ERROR_INVALID_CONTEXT:
    case cu::CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case cu::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
    case cu::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
    case cu::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED:
    case cu::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case cu::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
      return StatusCode::kFailedPrecondition;
    case cu::CUDA_ERROR_NOT_SUPPORTED:
      return StatusCode::kUnimplemented;
    case cu::CUDA_ERROR_NOT_PERMITTED:
      return StatusCode::kPermissionDenied;
    case cu::CUDA_ERROR_LAUNCH_TIMEOUT:
      return StatusCode::kDeadlineExceeded;
    // Sticky errors: the context is unusable; nothing the caller retries will help.
    case cu::CUDA_ERROR_ILLEGAL_ADDRESS:
    case cu::CUDA_ERROR_HARDWARE_STACK_ERROR:
    case cu::CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case cu::CUDA_ERROR_MISALIGNED_ADDRESS:
    case cu::CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case cu::CUDA_ERROR_INVALID_PC:
    case cu::CUDA_ERROR_LAUNCH_FAILED:
    case cu::CUDA_ERROR_ECC_UNCORRECTABLE:
    case cu::CUDA_ERROR_NVLINK_UNCORRECTABLE:
      return StatusCode::kInternal;
    default:
      return StatusCode::kUnknown;
  }
}

absl::Status Driver::Check(cu::CUresult result, absl::string_view call) const {
  if (result == cu::CUDA_SUCCESS) return absl::OkStatus();
  return CheckAs(result, call, CodeForCuResult(result));
}

absl::Status Driver::CheckAs(cu::CUresult result, absl::string_view call,
                             absl::StatusCode code) const {
  if (result == cu::CUDA_SUCCESS) return absl::OkStatus();
  const absl::StatusCode own = CodeForCuResult(result);
  if (own == absl::StatusCode::kResourceExhausted || own == absl::StatusCode::kInternal) {
    code = own;
  }
  const char* name = nullptr;
  const char* text = nullptr;
  if (api_.cuGetErrorName(result, &name) != cu::CUDA_SUCCESS || name == nullptr) {
    name = "CUDA_ERROR_UNRECOGNIZED";
  }
  if (api_.cuGetErrorString(result, &text) != cu::CUDA_SUCCESS || text == nullptr) {
    text = "unrecognized error code";
  }
  return WithForeignReason(
      absl::Status(code, absl::StrCat(call, ": ", name, " (", result, "): ", text)),
      name);
}

namespace {

// Each resolves its part of `api` from `lib` (`library`, for the message):
// FAILED_PRECONDITION CUDA_DRIVER_TOO_OLD naming the first entry point missing.
#define FL_RESOLVE(fn)                                                            \
  if (!Resolve(lib, #fn, api.fn)) {                                               \
    return WithReason(                                                            \
        absl::FailedPreconditionError(absl::StrCat(                               \
            "NVIDIA driver too old or not a driver: ", library, " lacks ", #fn)), \
        reasons::kCudaDriverTooOld);                                              \
  }

absl::Status ResolveDevicesAndMemory(void* lib, const std::string& library,
                                     DriverApi& api) {
  FL_RESOLVE(cuInit);
  FL_RESOLVE(cuDriverGetVersion);
  FL_RESOLVE(cuGetErrorName);
  FL_RESOLVE(cuGetErrorString);
  FL_RESOLVE(cuDeviceGetCount);
  FL_RESOLVE(cuDeviceGet);
  FL_RESOLVE(cuDeviceGetName);
  FL_RESOLVE(cuDeviceGetPCIBusId);
  FL_RESOLVE(cuDeviceGetAttribute);
  FL_RESOLVE(cuDeviceTotalMem_v2);
  FL_RESOLVE(cuDeviceCanAccessPeer);
  FL_RESOLVE(cuDevicePrimaryCtxRetain);
  FL_RESOLVE(cuDevicePrimaryCtxRelease_v2);
  FL_RESOLVE(cuCtxGetCurrent);
  FL_RESOLVE(cuCtxSetCurrent);
  FL_RESOLVE(cuCtxEnablePeerAccess);
  FL_RESOLVE(cuMemGetInfo_v2);
  FL_RESOLVE(cuMemAlloc_v2);
  FL_RESOLVE(cuMemFree_v2);
  FL_RESOLVE(cuMemGetAddressRange_v2);
  FL_RESOLVE(cuMemHostAlloc);
  FL_RESOLVE(cuMemFreeHost);
  FL_RESOLVE(cuMemHostRegister_v2);
  FL_RESOLVE(cuMemHostUnregister);
  FL_RESOLVE(cuMemGetAllocationGranularity);
  FL_RESOLVE(cuMemCreate);
  FL_RESOLVE(cuMemRelease);
  FL_RESOLVE(cuMemAddressReserve);
  FL_RESOLVE(cuMemAddressFree);
  FL_RESOLVE(cuMemMap);
  FL_RESOLVE(cuMemUnmap);
  FL_RESOLVE(cuMemSetAccess);
  FL_RESOLVE(cuMemExportToShareableHandle);
  FL_RESOLVE(cuMemImportFromShareableHandle);
  FL_RESOLVE(cuIpcGetMemHandle);
  FL_RESOLVE(cuIpcOpenMemHandle_v2);
  FL_RESOLVE(cuIpcCloseMemHandle);
  return absl::OkStatus();
}

absl::Status ResolveCopies(void* lib, const std::string& library, DriverApi& api) {
  FL_RESOLVE(cuStreamCreate);
  FL_RESOLVE(cuStreamDestroy_v2);
  FL_RESOLVE(cuStreamSynchronize);
  FL_RESOLVE(cuStreamQuery);
  FL_RESOLVE(cuEventCreate);
  FL_RESOLVE(cuEventDestroy_v2);
  FL_RESOLVE(cuEventRecord);
  FL_RESOLVE(cuEventSynchronize);
  FL_RESOLVE(cuEventQuery);
  FL_RESOLVE(cuEventElapsedTime);
  FL_RESOLVE(cuMemcpyDtoDAsync_v2);
  FL_RESOLVE(cuMemcpyHtoDAsync_v2);
  FL_RESOLVE(cuMemcpyDtoHAsync_v2);
  FL_RESOLVE(cuMemcpyPeerAsync);
  FL_RESOLVE(cuMemsetD8Async);
  FL_RESOLVE(cuModuleLoadData);
  FL_RESOLVE(cuModuleUnload);
  FL_RESOLVE(cuModuleGetFunction);
  FL_RESOLVE(cuLaunchKernel);
  // Optional entry points: discovery reports an empty UUID without them.
  if (!Resolve(lib, "cuDeviceGetUuid_v2", api.cuDeviceGetUuid)) {
    Resolve(lib, "cuDeviceGetUuid", api.cuDeviceGetUuid);
  }
  // Without it dma-buf export answers UNIMPLEMENTED (dmabuf.h); nothing else needs it.
  Resolve(lib, "cuMemGetHandleForAddressRange", api.cuMemGetHandleForAddressRange);
  return absl::OkStatus();
}
#undef FL_RESOLVE

}  // namespace

absl::StatusOr<std::unique_ptr<Driver>> Driver::Open(const std::string& library) {
  std::unique_ptr<Driver> driver(new Driver());
  driver->library_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (driver->library_ == nullptr) {
    const char* why = dlerror();
    return WithReason(absl::FailedPreconditionError(
                          absl::StrCat("no NVIDIA driver: ", library, " not found (",
                                       why != nullptr ? why : "dlopen failed", ")")),
                      reasons::kNoCudaDriver);
  }
  FL_RETURN_IF_ERROR(ResolveDevicesAndMemory(driver->library_, library, driver->api_));
  FL_RETURN_IF_ERROR(ResolveCopies(driver->library_, library, driver->api_));
  DriverApi& api = driver->api_;

  // Every failure here means "no usable GPU on this node": fix the node, not the call.
  if (absl::Status s = driver->Check(api.cuInit(0), "cuInit"); !s.ok()) {
    return WithForeignReason(
        absl::Status(absl::StatusCode::kFailedPrecondition, s.message()), ReasonOf(s));
  }
  FL_RETURN_IF_ERROR(FL_CU(*driver, cuDriverGetVersion, &driver->version_));
  return driver;
}

absl::StatusOr<std::unique_ptr<Driver>> Driver::LoadFrom(const std::string& library) {
  return Open(library);
}

absl::StatusOr<const Driver*> Driver::Load() {
  // Initialised once, thread-safely; the driver stays loaded for the process's life
  // (unloading libcuda under live contexts is not supported by the driver).
  static const absl::StatusOr<const Driver*> loaded =
      []() -> absl::StatusOr<const Driver*> {
    absl::StatusOr<std::unique_ptr<Driver>> driver = Open(kDriverLibrary);
    if (!driver.ok()) return driver.status();
    return driver->release();
  }();
  return loaded;
}

Driver::~Driver() {
  if (library_ != nullptr) dlclose(library_);
}

void ReportDroppedError(const absl::Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "fuselink gpu: error in a destructor, dropped: %s\n",
               status.ToString().c_str());
}

}  // namespace fuselink::gpu
