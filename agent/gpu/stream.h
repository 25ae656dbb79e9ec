// Streams, events and async copies. A Stream belongs to one GPU's primary context; each
// operation makes that context current for its own duration (DeviceGuard), so callers on
// any thread need no guard of their own. A Stream is used by one thread at a time.
#pragma once

#include <cstddef>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/gpu/cuda_types.h"
#include "agent/gpu/device.h"

namespace fuselink::gpu {

class Stream {
 public:
  // A non-blocking stream (does not synchronise with the legacy default stream).
  static absl::StatusOr<Stream> Create(const PrimaryContext& context);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  ~Stream() { ReportDroppedError(Destroy()); }
  absl::Status Destroy();

  // Within this GPU (or any pointers UVA resolves): copy engine.
  absl::Status CopyDeviceToDevice(cu::CUdeviceptr target, cu::CUdeviceptr source,
                                  size_t size_bytes);
  // From `source` on `source_context`'s GPU to `target` on `target_context`'s GPU, over
  // NVLink/PCIe P2P when peer access is enabled (EnablePeerAccess), else staged by the
  // driver.
  absl::Status CopyPeer(cu::CUdeviceptr target, const PrimaryContext& target_context,
                        cu::CUdeviceptr source, const PrimaryContext& source_context,
                        size_t size_bytes);
  // Host side must be pinned (PinnedHostBuffer, HostRegistration) to be asynchronous.
  absl::Status CopyHostToDevice(cu::CUdeviceptr target, const void* source,
                                size_t size_bytes);
  absl::Status CopyDeviceToHost(void* target, cu::CUdeviceptr source, size_t size_bytes);
  absl::Status Fill(cu::CUdeviceptr target, uint8_t value, size_t size_bytes);
  // Blocks until everything enqueued so far has run; the first error of the stream.
  // Unbounded: the agent's data path waits through a CopyBound (copy_bound.h) instead.
  absl::Status Synchronize();
  // Whether everything enqueued so far has run, without waiting; the stream's error.
  absl::StatusOr<bool> Done();

  cu::CUstream get() const { return stream_; }
  const PrimaryContext& context() const { return context_; }

 private:
  Stream(PrimaryContext context, cu::CUstream stream)
      : context_(std::move(context)), stream_(stream) {}

  PrimaryContext context_;
  cu::CUstream stream_ = nullptr;
};

class Event {
 public:
  static absl::StatusOr<Event> Create(const PrimaryContext& context, bool timing);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  ~Event() { ReportDroppedError(Destroy()); }
  absl::Status Destroy();

  absl::Status Record(Stream& stream);
  absl::Status Synchronize();  // unbounded, as Stream::Synchronize
  // Whether the work before the last Record has run (true if never recorded).
  absl::StatusOr<bool> Done();
  // Milliseconds between two recorded, completed timing events.
  static absl::StatusOr<double> ElapsedMs(const Event& start, const Event& end);

  cu::CUevent get() const { return event_; }

 private:
  Event(PrimaryContext context, cu::CUevent event)
      : context_(std::move(context)), event_(event) {}

  PrimaryContext context_;
  cu::CUevent event_ = nullptr;
};

// Times `iterations` calls of `enqueue` (which puts work on `stream`) with events around
// them, after one untimed warm-up call. Returns seconds per iteration. For benchmarks.
absl::StatusOr<double> TimeOnStream(Stream& stream, int iterations,
                                    const std::function<absl::Status()>& enqueue);

}  // namespace fuselink::gpu
