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

void IpcImports::ReportStats(stats::Sink& sink) const {
  static constexpr stats::Family kRefusals{
      "fuselink_gpu_handle_refusals_total",
      "CUDA IPC handles refused, by reason: OWNER_TOKEN_REQUIRED (no token from the "
      "handle socket), GPU_HANDLE_OWNED (another owner lent it), GPU_HANDLE_CLOSING (its "
      "import still closing past the bound).",
      stats::Kind::kCounter};
  const ImportRefusals r = refusals();
  for (const auto& [reason, n] : {std::pair{"OWNER_TOKEN_REQUIRED", r.no_owner_token},
                                  std::pair{"GPU_HANDLE_OWNED", r.owned},
                                  std::pair{"GPU_HANDLE_CLOSING", r.closing}}) {
    sink.Add(kRefusals, {{"reason", reason}}, static_cast<double>(n));
  }
}

}  // namespace fuselink::services
