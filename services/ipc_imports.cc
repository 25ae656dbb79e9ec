#include "services/ipc_imports.h"

namespace fuselink::services {

absl::StatusOr<std::shared_ptr<const gpu::IpcImport>> IpcImports::Open(
    int gpu, const gpu::PrimaryContext& context, const gpu::IpcMemHandle& handle) {
  const std::pair<int, std::string> key(
      gpu, std::string(reinterpret_cast<const char*>(handle.data()), handle.size()));
  absl::MutexLock lock(&mu_);
  for (auto it = open_.begin(); it != open_.end();) {  // few: one per lent allocation
    it = it->second.expired() ? open_.erase(it) : std::next(it);
  }
  if (auto it = open_.find(key); it != open_.end()) {
    if (std::shared_ptr<const gpu::IpcImport> held = it->second.lock()) return held;
  }
  // The whole allocation: each region checks its own range against it.
  absl::StatusOr<gpu::IpcImport> opened = gpu::IpcImport::Open(context, handle, 0, 1);
  if (!opened.ok()) return opened.status();
  auto held = std::make_shared<const gpu::IpcImport>(std::move(*opened));
  open_[key] = held;
  return held;
}

}  // namespace fuselink::services
