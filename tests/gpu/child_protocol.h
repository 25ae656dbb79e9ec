// Messages between the GPU tests and gpu_child, fixed-size structs on a socket pair.
#pragma once

#include <cstdint>

namespace fuselink::gpu::testing {

// Parent -> child, with the VMM fd attached.
struct VmmRequest {
  uint64_t size_bytes;
  uint64_t seed;
};

// Child -> parent, once: success (with the IPC handle, in ipc-export) or the error.
struct ChildReply {
  uint32_t failed;
  uint8_t ipc_handle[64];
  char error[512];
};

}  // namespace fuselink::gpu::testing
