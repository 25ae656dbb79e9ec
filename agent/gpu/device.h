// GPUs of this node: what they can do, their primary contexts, and a scoped guard that
// makes one current on the calling thread.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/gpu/cuda_types.h"
#include "agent/gpu/driver.h"

namespace fuselink::gpu {

// What fuselink needs to know about one GPU. Filled by QueryDevice.
struct DeviceInfo {
  int ordinal = -1;
  std::string name;
  std::string pci_bus_id;  // "0000:19:00.0", as sysfs and NICs' topology name it
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
  uint64_t total_bytes = 0;
  bool unified_addressing = false;
  bool vmm = false;                 // cuMemCreate / cuMemMap
  bool posix_fd_handles = false;    // VMM memory exportable as a POSIX fd
  bool gpudirect_rdma = false;      // a NIC can DMA into its memory
  bool gpudirect_rdma_vmm = false;  // ... also into VMM allocations
  bool dma_buf = false;             // exportable as dma-buf (ibv_reg_dmabuf_mr)
};

absl::StatusOr<int> DeviceCount(const Driver& driver);
absl::StatusOr<DeviceInfo> QueryDevice(const Driver& driver, int ordinal);
// Whether GPU `from` can map GPU `to`'s memory (NVLink or PCIe P2P).
absl::StatusOr<bool> CanAccessPeer(const Driver& driver, int from, int to);

// A retained primary context of one GPU: the context the CUDA runtime, PyTorch and the
// agent all share on that device. Retain on creation, release on destruction. Move-only;
// not thread-affine (any thread may make it current through a DeviceGuard).
class PrimaryContext {
 public:
  static absl::StatusOr<PrimaryContext> Retain(const Driver& driver, int ordinal);

  PrimaryContext(PrimaryContext&& other) noexcept;
  PrimaryContext& operator=(PrimaryContext&& other) noexcept;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  ~PrimaryContext();

  // Another retain of the same context, for objects that must keep it alive.
  absl::StatusOr<PrimaryContext> Clone() const { return Retain(*driver_, ordinal_); }
  // Releases now; the first error. Idempotent.
  absl::Status Release();

  const Driver& driver() const { return *driver_; }
  int ordinal() const { return ordinal_; }
  cu::CUdevice device() const { return device_; }
  cu::CUcontext get() const { return context_; }

 private:
  PrimaryContext(const Driver* driver, int ordinal, cu::CUdevice device,
                 cu::CUcontext context)
      : driver_(driver), ordinal_(ordinal), device_(device), context_(context) {}

  const Driver* driver_ = nullptr;
  int ordinal_ = -1;
  cu::CUdevice device_ = 0;
  cu::CUcontext context_ = nullptr;
};

// Makes `context` current on this thread for the guard's scope and restores the
// previous current context (possibly none) at its end. Not movable: it belongs to one
// scope of one thread. Check status() before relying on it.
//   DeviceGuard guard(ctx);
//   FL_RETURN_IF_ERROR(guard.status());
class DeviceGuard {
 public:
  explicit DeviceGuard(const PrimaryContext& context);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  const absl::Status& status() const { return status_; }

 private:
  const Driver& driver_;
  cu::CUcontext previous_ = nullptr;
  bool switched_ = false;
  absl::Status status_;
};

// Lets kernels and copies in `from` reach memory of `to` directly. Already enabled is
// success. FAILED_PRECONDITION when the pair has no P2P path.
absl::Status EnablePeerAccess(const PrimaryContext& from, const PrimaryContext& to);

// Free and total bytes of the context's device.
struct MemoryInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};
absl::StatusOr<MemoryInfo> DeviceMemoryInfo(const PrimaryContext& context);

}  // namespace fuselink::gpu
