// The CUDA IPC handles this agent has open, shared by every region that lies in the
// same allocation. A handle opens only once per process, and engines lend several
// tensors of one allocation (PyTorch's caching allocator cuts small per-layer tensors
// from one segment): the second region reuses the first's import instead of failing.
// Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/gpu/ipc.h"

namespace fuselink::services {

class IpcImports {
 public:
  // The allocation `handle` names on `gpu`, opened once while anyone holds it.
  absl::StatusOr<std::shared_ptr<const gpu::IpcImport>> Open(
      int gpu, const gpu::PrimaryContext& context, const gpu::IpcMemHandle& handle);

 private:
  absl::Mutex mu_;
  // By GPU and handle bytes; entries whose import is gone are dropped as found.
  std::map<std::pair<int, std::string>, std::weak_ptr<const gpu::IpcImport>> open_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace fuselink::services
