#include "agent/relay/cuda_copier.h"

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::relay {

absl::StatusOr<gpu::Stream*> CudaCopier::StreamOf(int gpu) {
  if (!runtime_->has(gpu)) {
    return absl::FailedPreconditionError(absl::StrCat("no GPU ", gpu, " here"));
  }
  if (!streams_[gpu].has_value()) {
    FL_ASSIGN_OR_RETURN(streams_[gpu], gpu::Stream::Create(runtime_->context(gpu)));
  }
  return &*streams_[gpu];
}

absl::Status CudaCopier::Start(const fabric::Place& to, const fabric::Place& from,
                               uint64_t bytes) {
  const auto address = [](const fabric::Place& p) {
    return static_cast<gpu::cu::CUdeviceptr>(reinterpret_cast<uintptr_t>(p.base));
  };
  // The source GPU's stream pushes; into a GPU from the host, the target's pulls.
  const int gpu = from.gpu >= 0 ? from.gpu : to.gpu;
  FL_ASSIGN_OR_RETURN(gpu::Stream * stream, StreamOf(gpu));
  busy_[gpu] = true;
  if (from.gpu >= 0 && to.gpu >= 0 && from.gpu != to.gpu) {
    FL_ASSIGN_OR_RETURN(gpu::Stream * target, StreamOf(to.gpu));
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

absl::Status CudaCopier::Wait() {
  absl::Status first = absl::OkStatus();
  for (size_t g = 0; g < streams_.size(); ++g) {
    if (busy_[g]) first.Update(streams_[g]->Synchronize());
    busy_[g] = false;
  }
  return first;
}

}  // namespace fuselink::relay
