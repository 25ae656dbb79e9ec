#include "agent/relay/cuda_copier.h"

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::relay {

CudaCopier::~CudaCopier() {
  gpu::KeepUntilIdle(
      std::move(streams_),
      std::make_shared<std::vector<std::shared_ptr<const void>>>(std::move(kept_)), 0);
}

absl::Status CudaCopier::Start(const fabric::Place& to, const fabric::Place& from,
                               uint64_t bytes) {
  const auto address = [](const fabric::Place& p) {
    return static_cast<gpu::cu::CUdeviceptr>(reinterpret_cast<uintptr_t>(p.base));
  };
  // The source GPU's stream pushes; into a GPU from the host, the target's pulls.
  const int gpu = from.gpu >= 0 ? from.gpu : to.gpu;
  FL_ASSIGN_OR_RETURN(gpu::Stream * stream, streams_->For(gpu));
  if (from.gpu >= 0 && to.gpu >= 0 && from.gpu != to.gpu) {
    FL_ASSIGN_OR_RETURN(gpu::Stream * target, streams_->For(to.gpu));
    FL_RETURN_IF_ERROR(stream->CopyPeer(address(to), target->context(), address(from),
                                        stream->context(), bytes));
  } else if (from.gpu >= 0 && to.gpu >= 0) {
    FL_RETURN_IF_ERROR(stream->CopyDeviceToDevice(address(to), address(from), bytes));
  } else if (from.gpu >= 0) {
    FL_RETURN_IF_ERROR(stream->CopyDeviceToHost(to.base, address(from), bytes));
  } else {
    FL_RETURN_IF_ERROR(stream->CopyHostToDevice(address(to), from.base, bytes));
  }
  return absl::OkStatus();
}

absl::Status CudaCopier::Wait() { return streams_->Wait("an in-node copy"); }

void CudaCopier::KeepWhileBusy(std::shared_ptr<const void> memory) {
  kept_.push_back(std::move(memory));
}

}  // namespace fuselink::relay
