// The few CUDA driver API types and constants fuselink uses, declared here so that the
// agent builds on machines without the CUDA toolkit and never links libcuda: the
// driver is loaded at run time (driver.h).
//
// Include this header before cuda.h, never after: cuda.h defines a few of these names
// as macros. Each name is the driver API's public name (cuda.h, CUDA 12/13) inside
// namespace fuselink::gpu::cu, with the value and layout the driver's ABI fixes. These
// are the stable ABI of libcuda.so.1 (the `_v1`/`_v2` structs and the versioned entry
// points named in driver.cc). Where CMake finds cuda.h, tests/gpu/cuda_abi_check.cc
// checks every value, size and field offset here against it at compile time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fuselink::gpu::cu {

// Result codes are plain ints so that any code a newer driver returns is representable.
using CUresult = int;
inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_DEINITIALIZED = 4;
inline constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
inline constexpr CUresult CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER = 36;
inline constexpr CUresult CUDA_ERROR_DEVICE_UNAVAILABLE = 46;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
inline constexpr CUresult CUDA_ERROR_INVALID_IMAGE = 200;
inline constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
inline constexpr CUresult CUDA_ERROR_MAP_FAILED = 205;
inline constexpr CUresult CUDA_ERROR_ALREADY_MAPPED = 208;
inline constexpr CUresult CUDA_ERROR_NO_BINARY_FOR_GPU = 209;
inline constexpr CUresult CUDA_ERROR_NOT_MAPPED = 211;
inline constexpr CUresult CUDA_ERROR_ECC_UNCORRECTABLE = 214;
inline constexpr CUresult CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217;
inline constexpr CUresult CUDA_ERROR_INVALID_PTX = 218;
inline constexpr CUresult CUDA_ERROR_NVLINK_UNCORRECTABLE = 220;
inline constexpr CUresult CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222;
inline constexpr CUresult CUDA_ERROR_FILE_NOT_FOUND = 301;
inline constexpr CUresult CUDA_ERROR_OPERATING_SYSTEM = 304;
inline constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
inline constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr CUresult CUDA_ERROR_ILLEGAL_ADDRESS = 700;
inline constexpr CUresult CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701;
inline constexpr CUresult CUDA_ERROR_LAUNCH_TIMEOUT = 702;
inline constexpr CUresult CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704;
inline constexpr CUresult CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705;
inline constexpr CUresult CUDA_ERROR_CONTEXT_IS_DESTROYED = 709;
inline constexpr CUresult CUDA_ERROR_TOO_MANY_PEERS = 711;
inline constexpr CUresult CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712;
inline constexpr CUresult CUDA_ERROR_HARDWARE_STACK_ERROR = 714;
inline constexpr CUresult CUDA_ERROR_ILLEGAL_INSTRUCTION = 715;
inline constexpr CUresult CUDA_ERROR_MISALIGNED_ADDRESS = 716;
inline constexpr CUresult CUDA_ERROR_INVALID_ADDRESS_SPACE = 717;
inline constexpr CUresult CUDA_ERROR_INVALID_PC = 718;
inline constexpr CUresult CUDA_ERROR_LAUNCH_FAILED = 719;
inline constexpr CUresult CUDA_ERROR_NOT_PERMITTED = 800;
inline constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
inline constexpr CUresult CUDA_ERROR_SYSTEM_NOT_READY = 802;
inline constexpr CUresult CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803;
inline constexpr CUresult CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804;
inline constexpr CUresult CUDA_ERROR_TIMEOUT = 909;
inline constexpr CUresult CUDA_ERROR_UNKNOWN = 999;

// Handles. Opaque pointers on the driver's side; 64-bit device addresses (UVA).
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUmemGenericAllocationHandle = unsigned long long;

// CUdevice_attribute (the ones read by device.cc).
using CUdevice_attribute = int;
inline constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
inline constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33;
inline constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41;
inline constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
inline constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
inline constexpr CUdevice_attribute
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102;
inline constexpr CUdevice_attribute
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103;
inline constexpr CUdevice_attribute
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110;
inline constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116;
inline constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124;

// Flags.
inline constexpr unsigned int CU_MEMHOSTALLOC_PORTABLE = 0x01;
inline constexpr unsigned int CU_MEMHOSTALLOC_DEVICEMAP = 0x02;
inline constexpr unsigned int CU_MEMHOSTREGISTER_PORTABLE = 0x01;
inline constexpr unsigned int CU_MEMHOSTREGISTER_DEVICEMAP = 0x02;
inline constexpr unsigned int CU_STREAM_NON_BLOCKING = 0x1;
inline constexpr unsigned int CU_EVENT_DEFAULT = 0x0;
inline constexpr unsigned int CU_EVENT_DISABLE_TIMING = 0x2;
inline constexpr unsigned int CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1;

// CUDA IPC: what cudaIpcGetMemHandle / cuIpcGetMemHandle produce, 64 opaque bytes.
inline constexpr size_t CU_IPC_HANDLE_SIZE = 64;
// A device's UUID (cuDeviceGetUuid): 16 bytes.
struct CUuuid {
  char bytes[16];
};

struct CUipcMemHandle {
  char reserved[CU_IPC_HANDLE_SIZE];
};

// Virtual memory management (cuMemCreate and friends).
using CUmemAllocationType = int;
inline constexpr CUmemAllocationType CU_MEM_ALLOCATION_TYPE_PINNED = 0x1;
using CUmemAllocationHandleType = int;
inline constexpr CUmemAllocationHandleType CU_MEM_HANDLE_TYPE_NONE = 0x0;
inline constexpr CUmemAllocationHandleType CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1;
using CUmemLocationType = int;
inline constexpr CUmemLocationType CU_MEM_LOCATION_TYPE_DEVICE = 0x1;
using CUmemAccess_flags = int;
inline constexpr CUmemAccess_flags CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3;
using CUmemAllocationGranularity_flags = int;
inline constexpr CUmemAllocationGranularity_flags CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0;
inline constexpr CUmemAllocationGranularity_flags CU_MEM_ALLOC_GRANULARITY_RECOMMENDED =
    0x1;

// Handles for an address range (cuMemGetHandleForAddressRange, CUDA 11.7+).
using CUmemRangeHandleType = int;
inline constexpr CUmemRangeHandleType CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 0x1;

struct CUmemLocation {  // CUmemLocation_v1
  CUmemLocationType type;
  int id;
};

struct CUmemAllocationProp {  // CUmemAllocationProp_v1
  CUmemAllocationType type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};

struct CUmemAccessDesc {  // CUmemAccessDesc_v1
  CUmemLocation location;
  CUmemAccess_flags flags;
};

}  // namespace fuselink::gpu::cu
