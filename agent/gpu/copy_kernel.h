// A copy kernel: SM loads and stores of 16 bytes per thread, grid-stride. Unlike the
// copy engine it can store through any mapping the GPU can reach — a VMM window whose
// granules sit on a relay GPU (relay path D1), a peer's cuMemAlloc memory. Shipped as
// PTX text that the driver compiles for the device on load, so no nvcc is needed to
// build the agent.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/gpu/cuda_types.h"
#include "agent/gpu/device.h"
#include "agent/gpu/stream.h"

namespace fuselink::gpu {

// Threads per block of the launch; blocks per multiprocessor.
inline constexpr unsigned int kCopyThreadsPerBlock = 512;
inline constexpr unsigned int kCopyBlocksPerSm = 4;

class CopyKernel {
 public:
  // Loads the module into `context` (JIT from PTX: tens of ms, once per GPU).
  static absl::StatusOr<CopyKernel> Load(const PrimaryContext& context);
  CopyKernel(CopyKernel&& other) noexcept;
  CopyKernel& operator=(CopyKernel&& other) noexcept;
  ~CopyKernel() { ReportDroppedError(Unload()); }
  absl::Status Unload();

  // Enqueues a copy of `size_bytes` on `stream` (of this kernel's GPU). `target`,
  // `source` and `size_bytes` must be multiples of 16: INVALID_ARGUMENT otherwise.
  absl::Status Launch(Stream& stream, cu::CUdeviceptr target, cu::CUdeviceptr source,
                      size_t size_bytes) const;

 private:
  CopyKernel(PrimaryContext context, cu::CUmodule module, cu::CUfunction function,
             unsigned int blocks)
      : context_(std::move(context)),
        module_(module),
        function_(function),
        blocks_(blocks) {}

  PrimaryContext context_;
  cu::CUmodule module_ = nullptr;
  cu::CUfunction function_ = nullptr;
  unsigned int blocks_ = 0;
};

}  // namespace fuselink::gpu
