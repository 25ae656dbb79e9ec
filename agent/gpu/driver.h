// The CUDA driver, loaded at run time. The agent never links libcuda: on a node with no
// NVIDIA driver or no GPU it starts, serves host memory, and says why GPU paths are off.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/gpu/cuda_types.h"

namespace fuselink::gpu {

// The driver entry points fuselink calls, resolved by their versioned ABI names (the
// names cuda.h's macros expand to for CUDA 12/13, e.g. cuMemAlloc -> cuMemAlloc_v2).
// Every one is resolved at load and a driver lacking one does not load, except those
// marked optional, which are null on a driver without them.
struct DriverApi {
  using R = cu::CUresult;
  // Setup and errors.
  R (*cuInit)(unsigned int flags);
  R (*cuDriverGetVersion)(int* version);
  R (*cuGetErrorName)(R error, const char** name);
  R (*cuGetErrorString)(R error, const char** text);
  // Devices and contexts.
  R (*cuDeviceGetCount)(int* count);
  R (*cuDeviceGet)(cu::CUdevice* device, int ordinal);
  R (*cuDeviceGetName)(char* name, int len, cu::CUdevice device);
  R (*cuDeviceGetPCIBusId)(char* bus_id, int len, cu::CUdevice device);
  R (*cuDeviceGetAttribute)(int* value, cu::CUdevice_attribute attr, cu::CUdevice device);
  R (*cuDeviceTotalMem_v2)(size_t* bytes, cu::CUdevice device);
  R (*cuDeviceCanAccessPeer)(int* can, cu::CUdevice device, cu::CUdevice peer);
  // Optional: cuDeviceGetUuid_v2 (CUDA 11.4+), else cuDeviceGetUuid (CUDA 9.2+).
  R (*cuDeviceGetUuid)(cu::CUuuid* uuid, cu::CUdevice device);
  R (*cuDevicePrimaryCtxRetain)(cu::CUcontext* ctx, cu::CUdevice device);
  R (*cuDevicePrimaryCtxRelease_v2)(cu::CUdevice device);
  R (*cuCtxGetCurrent)(cu::CUcontext* ctx);
  R (*cuCtxSetCurrent)(cu::CUcontext ctx);
  R (*cuCtxEnablePeerAccess)(cu::CUcontext peer, unsigned int flags);
  R (*cuMemGetInfo_v2)(size_t* free_bytes, size_t* total_bytes);
  // Plain allocations and pinned host memory.
  R (*cuMemAlloc_v2)(cu::CUdeviceptr* ptr, size_t bytes);
  R (*cuMemFree_v2)(cu::CUdeviceptr ptr);
  R (*cuMemGetAddressRange_v2)(cu::CUdeviceptr* base, size_t* bytes, cu::CUdeviceptr ptr);
  R (*cuMemHostAlloc)(void** ptr, size_t bytes, unsigned int flags);
  R (*cuMemFreeHost)(void* ptr);
  R (*cuMemHostRegister_v2)(void* ptr, size_t bytes, unsigned int flags);
  R (*cuMemHostUnregister)(void* ptr);
  // Virtual memory management.
  R(*cuMemGetAllocationGranularity)
  (size_t* granule, const cu::CUmemAllocationProp* prop,
   cu::CUmemAllocationGranularity_flags option);
  R(*cuMemCreate)
  (cu::CUmemGenericAllocationHandle* handle, size_t bytes,
   const cu::CUmemAllocationProp* prop, unsigned long long flags);
  R (*cuMemRelease)(cu::CUmemGenericAllocationHandle handle);
  R(*cuMemAddressReserve)
  (cu::CUdeviceptr* ptr, size_t bytes, size_t alignment, cu::CUdeviceptr addr,
   unsigned long long flags);
  R (*cuMemAddressFree)(cu::CUdeviceptr ptr, size_t bytes);
  R(*cuMemMap)
  (cu::CUdeviceptr ptr, size_t bytes, size_t offset,
   cu::CUmemGenericAllocationHandle handle, unsigned long long flags);
  R (*cuMemUnmap)(cu::CUdeviceptr ptr, size_t bytes);
  R(*cuMemSetAccess)
  (cu::CUdeviceptr ptr, size_t bytes, const cu::CUmemAccessDesc* desc, size_t count);
  R(*cuMemExportToShareableHandle)
  (void* shareable, cu::CUmemGenericAllocationHandle handle,
   cu::CUmemAllocationHandleType type, unsigned long long flags);
  R(*cuMemImportFromShareableHandle)
  (cu::CUmemGenericAllocationHandle* handle, void* os_handle,
   cu::CUmemAllocationHandleType type);
  // dma-buf export for GPUDirect RDMA (ibv_reg_dmabuf_mr). Optional: CUDA 11.7+.
  R(*cuMemGetHandleForAddressRange)
  (void* handle, cu::CUdeviceptr ptr, size_t bytes, cu::CUmemRangeHandleType type,
   unsigned long long flags);
  // CUDA IPC.
  R (*cuIpcGetMemHandle)(cu::CUipcMemHandle* handle, cu::CUdeviceptr ptr);
  R(*cuIpcOpenMemHandle_v2)
  (cu::CUdeviceptr* ptr, cu::CUipcMemHandle handle, unsigned int flags);
  R (*cuIpcCloseMemHandle)(cu::CUdeviceptr ptr);
  // Streams, events, copies.
  R (*cuStreamCreate)(cu::CUstream* stream, unsigned int flags);
  R (*cuStreamDestroy_v2)(cu::CUstream stream);
  R (*cuStreamSynchronize)(cu::CUstream stream);
  R (*cuStreamQuery)(cu::CUstream stream);
  R (*cuEventCreate)(cu::CUevent* event, unsigned int flags);
  R (*cuEventDestroy_v2)(cu::CUevent event);
  R (*cuEventRecord)(cu::CUevent event, cu::CUstream stream);
  R (*cuEventSynchronize)(cu::CUevent event);
  R (*cuEventQuery)(cu::CUevent event);
  R (*cuEventElapsedTime)(float* ms, cu::CUevent start, cu::CUevent end);
  R(*cuMemcpyDtoDAsync_v2)
  (cu::CUdeviceptr dst, cu::CUdeviceptr src, size_t bytes, cu::CUstream stream);
  R(*cuMemcpyHtoDAsync_v2)
  (cu::CUdeviceptr dst, const void* src, size_t bytes, cu::CUstream stream);
  R(*cuMemcpyDtoHAsync_v2)
  (void* dst, cu::CUdeviceptr src, size_t bytes, cu::CUstream stream);
  R(*cuMemcpyPeerAsync)
  (cu::CUdeviceptr dst, cu::CUcontext dst_ctx, cu::CUdeviceptr src, cu::CUcontext src_ctx,
   size_t bytes, cu::CUstream stream);
  R(*cuMemsetD8Async)
  (cu::CUdeviceptr dst, unsigned char value, size_t bytes, cu::CUstream stream);
  // Kernels (copy_kernel.cc loads PTX; the driver compiles it for the device).
  R (*cuModuleLoadData)(cu::CUmodule* module, const void* image);
  R (*cuModuleUnload)(cu::CUmodule module);
  R (*cuModuleGetFunction)(cu::CUfunction* fn, cu::CUmodule module, const char* name);
  R(*cuLaunchKernel)
  (cu::CUfunction fn, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
   unsigned int block_x, unsigned int block_y, unsigned int block_z,
   unsigned int shared_bytes, cu::CUstream stream, void** params, void** extra);
};

// The code a caller gets for a CUresult, chosen by what the caller should do about it
// (STYLE.md): bad handle or argument -> INVALID_ARGUMENT, out of memory ->
// RESOURCE_EXHAUSTED, not ready -> UNAVAILABLE, missing device/driver/peer state ->
// FAILED_PRECONDITION, unsupported -> UNIMPLEMENTED, not permitted -> PERMISSION_DENIED,
// a dead context (illegal address, launch failure, ECC) -> INTERNAL. Pure.
absl::StatusCode CodeForCuResult(cu::CUresult result);

class Driver {
 public:
  // The process-wide driver from libcuda.so.1, loaded and initialised (cuInit) on the
  // first call; later calls return the same result, success or failure. Thread-safe.
  // FAILED_PRECONDITION with the reason when there is no driver or no device, e.g.
  // "no NVIDIA driver: libcuda.so.1 not found (...)" or
  // "cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected".
  static absl::StatusOr<const Driver*> Load();

  // Loads `library` afresh (not cached; for tests and diagnostics). Same errors as Load.
  static absl::StatusOr<std::unique_ptr<Driver>> LoadFrom(const std::string& library);

  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  const DriverApi& api() const { return api_; }
  // CUDA version of the driver, e.g. 13000.
  int version() const { return version_; }

  // The one place a CUresult becomes a Status: "<call>: <CUDA_ERROR_NAME>: <driver's
  // text>", code by CodeForCuResult, reason payload = the error's name. OK for success.
  absl::Status Check(cu::CUresult result, absl::string_view call) const;
  // Same, with the code chosen by the call site, for calls whose failures all mean one
  // thing to the caller (opening a handle another process sent: INVALID_ARGUMENT).
  // Out-of-memory and a dead context keep their own codes.
  absl::Status CheckAs(cu::CUresult result, absl::string_view call,
                       absl::StatusCode code) const;

 private:
  Driver() = default;
  static absl::StatusOr<std::unique_ptr<Driver>> Open(const std::string& library);

  void* library_ = nullptr;  // dlopen handle
  DriverApi api_{};
  int version_ = 0;
};

// Reports an error that a destructor cannot return (stderr), once per failure.
void ReportDroppedError(const absl::Status& status);

}  // namespace fuselink::gpu

// Calls driver entry point `fn` through `drv` (a const Driver&) and translates its
// result once, naming the call: FL_CU(drv, cuMemAlloc_v2, &ptr, bytes) is an
// absl::Status.
#define FL_CU(drv, fn, ...) (drv).Check((drv).api().fn(__VA_ARGS__), #fn)
