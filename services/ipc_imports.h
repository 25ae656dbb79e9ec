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
  IpcImports() : state_(std::make_shared<State>()) {}

  // The allocation `handle` names on `gpu`, opened once while anyone holds it. A
  // handle whose last holder is closing it right now is waited for, then opened anew.
  absl::StatusOr<std::shared_ptr<const gpu::IpcImport>> Open(
      int gpu, const gpu::PrimaryContext& context, const gpu::IpcMemHandle& handle);

 private:
  using Key = std::pair<int, std::string>;  // GPU, handle bytes
  // Shared with the imports' deleters, which may outlive this object.
  struct State {
    absl::Mutex mu;
    // An entry lives from its open until its import is closed (by its deleter).
    std::map<Key, std::weak_ptr<const gpu::IpcImport>> open ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
};

}  // namespace fuselink::services
