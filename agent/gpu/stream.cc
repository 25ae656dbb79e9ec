#include "agent/gpu/stream.h"

#include <utility>

#include "agent/common/status_macros.h"

// Each operation: guard the stream's context, call, translate once.
#define FL_STREAM_CALL(fn, ...)                       \
  do {                                                \
    DeviceGuard guard(context_);                      \
    FL_RETURN_IF_ERROR(guard.status());               \
    return FL_CU(context_.driver(), fn, __VA_ARGS__); \
  } while (0)

namespace fuselink::gpu {

absl::StatusOr<Stream> Stream::Create(const PrimaryContext& context) {
  FL_ASSIGN_OR_RETURN(PrimaryContext owned, context.Clone());
  DeviceGuard guard(owned);
  FL_RETURN_IF_ERROR(guard.status());
  cu::CUstream stream = nullptr;
  FL_RETURN_IF_ERROR(
      FL_CU(owned.driver(), cuStreamCreate, &stream, cu::CU_STREAM_NON_BLOCKING));
  return Stream(std::move(owned), stream);
}

Stream::Stream(Stream&& other) noexcept
    : context_(std::move(other.context_)),
      stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    ReportDroppedError(Destroy());
    context_ = std::move(other.context_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

absl::Status Stream::Destroy() {
  if (stream_ == nullptr) return absl::OkStatus();
  FL_STREAM_CALL(cuStreamDestroy_v2, std::exchange(stream_, nullptr));
}

absl::Status Stream::CopyDeviceToDevice(cu::CUdeviceptr target, cu::CUdeviceptr source,
                                        size_t size_bytes) {
  FL_STREAM_CALL(cuMemcpyDtoDAsync_v2, target, source, size_bytes, stream_);
}

absl::Status Stream::CopyPeer(cu::CUdeviceptr target,
                              const PrimaryContext& target_context,
                              cu::CUdeviceptr source,
                              const PrimaryContext& source_context, size_t size_bytes) {
  FL_STREAM_CALL(cuMemcpyPeerAsync, target, target_context.get(), source,
                 source_context.get(), size_bytes, stream_);
}

absl::Status Stream::CopyHostToDevice(cu::CUdeviceptr target, const void* source,
                                      size_t size_bytes) {
  FL_STREAM_CALL(cuMemcpyHtoDAsync_v2, target, source, size_bytes, stream_);
}

absl::Status Stream::CopyDeviceToHost(void* target, cu::CUdeviceptr source,
                                      size_t size_bytes) {
  FL_STREAM_CALL(cuMemcpyDtoHAsync_v2, target, source, size_bytes, stream_);
}

absl::Status Stream::Fill(cu::CUdeviceptr target, uint8_t value, size_t size_bytes) {
  FL_STREAM_CALL(cuMemsetD8Async, target, value, size_bytes, stream_);
}

absl::Status Stream::Synchronize() { FL_STREAM_CALL(cuStreamSynchronize, stream_); }

// CUDA_ERROR_NOT_READY is the answer "not yet", not an error.
#define FL_DONE_QUERY(fn, handle)                                   \
  do {                                                              \
    DeviceGuard guard(context_);                                    \
    FL_RETURN_IF_ERROR(guard.status());                             \
    const cu::CUresult result = context_.driver().api().fn(handle); \
    if (result == cu::CUDA_ERROR_NOT_READY) return false;           \
    FL_RETURN_IF_ERROR(context_.driver().Check(result, #fn));       \
    return true;                                                    \
  } while (0)

absl::StatusOr<bool> Stream::Done() { FL_DONE_QUERY(cuStreamQuery, stream_); }

// --- Event ---

absl::StatusOr<Event> Event::Create(const PrimaryContext& context, bool timing) {
  FL_ASSIGN_OR_RETURN(PrimaryContext owned, context.Clone());
  DeviceGuard guard(owned);
  FL_RETURN_IF_ERROR(guard.status());
  cu::CUevent event = nullptr;
  FL_RETURN_IF_ERROR(FL_CU(owned.driver(), cuEventCreate, &event,
                           timing ? cu::CU_EVENT_DEFAULT : cu::CU_EVENT_DISABLE_TIMING));
  return Event(std::move(owned), event);
}

Event::Event(Event&& other) noexcept
    : context_(std::move(other.context_)), event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    ReportDroppedError(Destroy());
    context_ = std::move(other.context_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

absl::Status Event::Destroy() {
  if (event_ == nullptr) return absl::OkStatus();
  FL_STREAM_CALL(cuEventDestroy_v2, std::exchange(event_, nullptr));
}

absl::Status Event::Record(Stream& stream) {
  FL_STREAM_CALL(cuEventRecord, event_, stream.get());
}

absl::Status Event::Synchronize() { FL_STREAM_CALL(cuEventSynchronize, event_); }

absl::StatusOr<bool> Event::Done() { FL_DONE_QUERY(cuEventQuery, event_); }

absl::StatusOr<double> Event::ElapsedMs(const Event& start, const Event& end) {
  float ms = 0;
  FL_RETURN_IF_ERROR(
      FL_CU(start.context_.driver(), cuEventElapsedTime, &ms, start.event_, end.event_));
  return ms;
}

absl::StatusOr<double> TimeOnStream(Stream& stream, int iterations,
                                    const std::function<absl::Status()>& enqueue) {
  if (iterations <= 0) return absl::InvalidArgumentError("iterations must be positive");
  FL_ASSIGN_OR_RETURN(Event start, Event::Create(stream.context(), /*timing=*/true));
  FL_ASSIGN_OR_RETURN(Event end, Event::Create(stream.context(), /*timing=*/true));
  FL_RETURN_IF_ERROR(enqueue());  // warm-up
  FL_RETURN_IF_ERROR(stream.Synchronize());
  FL_RETURN_IF_ERROR(start.Record(stream));
  for (int i = 0; i < iterations; ++i) FL_RETURN_IF_ERROR(enqueue());
  FL_RETURN_IF_ERROR(end.Record(stream));
  FL_RETURN_IF_ERROR(end.Synchronize());
  FL_ASSIGN_OR_RETURN(double ms, Event::ElapsedMs(start, end));
  return ms / 1e3 / iterations;
}

}  // namespace fuselink::gpu
