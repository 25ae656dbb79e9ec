#include "services/ipc_imports.h"

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace fuselink::services {

absl::StatusOr<std::shared_ptr<const gpu::IpcImport>> IpcImports::Open(
    int gpu, const gpu::PrimaryContext& context, const gpu::IpcMemHandle& handle) {
  const Key key(gpu,
                std::string(reinterpret_cast<const char*>(handle.data()), handle.size()));
  State& s = *state_;
  for (;;) {
    {
      absl::MutexLock lock(&s.mu);
      auto it = s.open.find(key);
      if (it == s.open.end()) break;
      if (std::shared_ptr<const gpu::IpcImport> held = it->second.lock()) return held;
    }
    // Its last holder let go and its deleter is closing the handle: wait for that.
    absl::SleepFor(absl::Microseconds(200));
  }
  absl::MutexLock lock(&s.mu);
  if (auto it = s.open.find(key); it != s.open.end()) {  // opened meanwhile
    if (std::shared_ptr<const gpu::IpcImport> held = it->second.lock()) return held;
    return absl::UnavailableError("the allocation's IPC handle is being closed; retry");
  }
  // The whole allocation: each region checks its own range against it.
  absl::StatusOr<gpu::IpcImport> opened = gpu::IpcImport::Open(context, handle, 0, 1);
  if (!opened.ok()) return opened.status();
  std::shared_ptr<const gpu::IpcImport> held(
      new gpu::IpcImport(std::move(*opened)),
      [state = state_, key](const gpu::IpcImport* import) {
        // Closed, then forgotten, under the lock: Open never finds the entry gone
        // while the driver still holds the handle open.
        absl::MutexLock lock(&state->mu);
        delete import;
        state->open.erase(key);
      });
  s.open[key] = held;
  return held;
}

}  // namespace fuselink::services
