// Plain device allocations and page-locked host memory. One RAII type per kind of
// handle; each keeps its own retain of the primary context it was made in, so it may
// outlive the caller's PrimaryContext. Move-only; not thread-safe to free concurrently.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/gpu/cuda_types.h"
#include "agent/gpu/device.h"

namespace fuselink::gpu {

// Device memory from cuMemAlloc (what cudaMalloc gives).
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(const PrimaryContext& context,
                                               size_t size_bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer() { ReportDroppedError(Free()); }

  // Frees now; the first error. Idempotent.
  absl::Status Free();

  cu::CUdeviceptr ptr() const { return ptr_; }
  size_t size_bytes() const { return size_bytes_; }
  const PrimaryContext& context() const { return context_; }

 private:
  DeviceBuffer(PrimaryContext context, cu::CUdeviceptr ptr, size_t size_bytes)
      : context_(std::move(context)), ptr_(ptr), size_bytes_(size_bytes) {}

  PrimaryContext context_;  // declared first: released last
  cu::CUdeviceptr ptr_ = 0;
  size_t size_bytes_ = 0;
};

// Page-locked host memory from cuMemHostAlloc, portable across contexts and mapped
// into the device address space: copies to and from it run at PCIe speed, async.
class PinnedHostBuffer {
 public:
  static absl::StatusOr<PinnedHostBuffer> Allocate(const PrimaryContext& context,
                                                   size_t size_bytes);
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  ~PinnedHostBuffer() { ReportDroppedError(Free()); }

  absl::Status Free();

  void* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }

 private:
  PinnedHostBuffer(PrimaryContext context, void* data, size_t size_bytes)
      : context_(std::move(context)), data_(data), size_bytes_(size_bytes) {}

  PrimaryContext context_;
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
};

// Existing host memory (a memfd mapping, a tensor's pages) page-locked in place with
// cuMemHostRegister until destruction. The memory must outlive the registration.
class HostRegistration {
 public:
  static absl::StatusOr<HostRegistration> Register(const PrimaryContext& context,
                                                   void* data, size_t size_bytes);
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  ~HostRegistration() { ReportDroppedError(Unregister()); }

  absl::Status Unregister();

  void* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }

 private:
  HostRegistration(PrimaryContext context, void* data, size_t size_bytes)
      : context_(std::move(context)), data_(data), size_bytes_(size_bytes) {}

  PrimaryContext context_;
  void* data_ = nullptr;
  size_t size_bytes_ = 0;
};

}  // namespace fuselink::gpu
