#include "agent/node/ipc_imports.h"

namespace fuselink::services {

absl::StatusOr<std::shared_ptr<const gpu::IpcImport>> IpcImports::Open(
    int gpu, const gpu::PrimaryContext& context, const gpu::IpcMemHandle& handle,
    const ImportOwner& owner) {
  const SharedImports<gpu::IpcImport>::Key key(
      gpu, std::string(reinterpret_cast<const char*>(handle.data()), handle.size()));
  return imports_.Open(key, owner,
                       [&]() -> absl::StatusOr<std::unique_ptr<gpu::IpcImport>> {
                         // The whole allocation: each region checks its own range against
                         // it.
                         absl::StatusOr<gpu::IpcImport> opened =
                             gpu::IpcImport::Open(context, handle, 0, 1);
                         if (!opened.ok()) return opened.status();
                         return std::make_unique<gpu::IpcImport>(std::move(*opened));
                       });
}

}  // namespace fuselink::services
