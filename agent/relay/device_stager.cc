#include "agent/relay/device_stager.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/gpu/dmabuf.h"
#include "agent/gpu/memory.h"
#include "agent/gpu/stream.h"
#include "agent/gpu/stream_set.h"

namespace fuselink::relay {
namespace {

class CudaStage final : public fabric::DeviceStage {
 public:
  static absl::StatusOr<std::unique_ptr<CudaStage>> Create(const gpu::Runtime* runtime,
                                                           gpu::CopyBound* bound,
                                                           int nic_gpu,
                                                           uint32_t piece_bytes,
                                                           CudaDeviceStager::Held* held) {
    std::unique_ptr<CudaStage> stage(
        new CudaStage(runtime, bound, nic_gpu, piece_bytes, held));
    const gpu::PrimaryContext& home = runtime->context(nic_gpu >= 0 ? nic_gpu : 0);
    for (auto& host : stage->memory_->host) {
      FL_ASSIGN_OR_RETURN(host, gpu::PinnedHostBuffer::Allocate(home, piece_bytes));
      held->host.fetch_add(piece_bytes, std::memory_order_relaxed);
    }
    return stage;
  }

  uint32_t piece_bytes() const override { return piece_bytes_; }
  uint8_t* buffer(int i) override {
    return static_cast<uint8_t*>(memory_->host[i]->data());
  }

  absl::Status StartToHost(int gpu, uint64_t source, int i, uint32_t bytes) override {
    FL_ASSIGN_OR_RETURN(gpu::Stream * stream, streams_->For(gpu));
    return stream->CopyDeviceToHost(buffer(i), source, bytes);
  }

  absl::Status StartToDevice(int gpu, uint64_t target, int i, uint32_t bytes) override {
    if (nic_gpu_ < 0 || gpu == nic_gpu_) {
      FL_ASSIGN_OR_RETURN(gpu::Stream * stream, streams_->For(gpu));
      return stream->CopyHostToDevice(target, buffer(i), bytes);
    }
    // Over the NIC's GPU's PCIe link into its landing buffer, then NVLink.
    FL_ASSIGN_OR_RETURN(gpu::Stream * stream, streams_->For(nic_gpu_));
    FL_ASSIGN_OR_RETURN(uint64_t landing, Landing(i));
    FL_RETURN_IF_ERROR(stream->CopyHostToDevice(landing, buffer(i), bytes));
    return stream->CopyDeviceToDevice(target, landing, bytes);
  }

  absl::Status StartToHostAt(int gpu, uint64_t source, uint8_t* host,
                             uint32_t bytes) override {
    FL_ASSIGN_OR_RETURN(gpu::Stream * stream, streams_->For(gpu));
    return stream->CopyDeviceToHost(host, source, bytes);
  }

  // In pieces through landing buffer 0 when the bytes are bound for another GPU than
  // the NIC's: one stream orders each piece's NVLink copy before the next lands.
  absl::Status StartToDeviceFrom(int gpu, uint64_t target, const uint8_t* host,
                                 uint32_t bytes) override {
    if (nic_gpu_ < 0 || gpu == nic_gpu_) {
      FL_ASSIGN_OR_RETURN(gpu::Stream * stream, streams_->For(gpu));
      return stream->CopyHostToDevice(target, host, bytes);
    }
    FL_ASSIGN_OR_RETURN(gpu::Stream * stream, streams_->For(nic_gpu_));
    FL_ASSIGN_OR_RETURN(uint64_t landing, Landing(0));
    for (uint32_t at = 0; at < bytes; at += piece_bytes_) {
      const uint32_t n = std::min(piece_bytes_, bytes - at);
      FL_RETURN_IF_ERROR(stream->CopyHostToDevice(landing, host + at, n));
      FL_RETURN_IF_ERROR(stream->CopyDeviceToDevice(target + at, landing, n));
    }
    return absl::OkStatus();
  }

  absl::Status Wait() override { return streams_->Wait("a staging copy"); }

  void KeepWhileBusy(std::shared_ptr<const void> memory) override {
    memory_->kept.push_back(std::move(memory));
  }

  ~CudaStage() override {
    uint64_t bytes = 0;
    for (int i = 0; i < 2; ++i) {
      if (memory_->host[i].has_value()) bytes += piece_bytes_;
      if (memory_->landing[i].has_value()) held_->device.fetch_sub(piece_bytes_);
    }
    held_->host.fetch_sub(bytes);
    // A copy past its bound may still write these buffers: they go only once it ends.
    gpu::KeepUntilIdle(std::move(streams_), std::move(memory_), bytes);
  }

 private:
  // What the stage's copies read and write.
  struct Memory {
    std::optional<gpu::PinnedHostBuffer> host[2];
    std::optional<gpu::DeviceBuffer> landing[2];
    std::vector<std::shared_ptr<const void>> kept;  // KeepWhileBusy
  };

  CudaStage(const gpu::Runtime* runtime, gpu::CopyBound* bound, int nic_gpu,
            uint32_t piece_bytes, CudaDeviceStager::Held* held)
      : runtime_(runtime),
        held_(held),
        nic_gpu_(nic_gpu),
        piece_bytes_(piece_bytes),
        streams_(std::make_unique<gpu::StreamSet>(runtime, bound)),
        memory_(std::make_shared<Memory>()) {}

  absl::StatusOr<uint64_t> Landing(int i) {
    std::optional<gpu::DeviceBuffer>& landing = memory_->landing[i];
    if (!landing.has_value()) {
      FL_ASSIGN_OR_RETURN(landing, gpu::DeviceBuffer::Allocate(
                                       runtime_->context(nic_gpu_), piece_bytes_));
      held_->device.fetch_add(piece_bytes_, std::memory_order_relaxed);
    }
    return landing->ptr();
  }

  const gpu::Runtime* const runtime_;
  CudaDeviceStager::Held* const held_;
  const int nic_gpu_;
  const uint32_t piece_bytes_;
  std::unique_ptr<gpu::StreamSet> streams_;
  std::shared_ptr<Memory> memory_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<fabric::DeviceStage>> CudaDeviceStager::NewStage(int nic) {
  const int gpu = nic < static_cast<int>(nic_gpu_.size()) ? nic_gpu_[nic] : -1;
  FL_ASSIGN_OR_RETURN(std::unique_ptr<CudaStage> stage,
                      CudaStage::Create(runtime_, bound_, runtime_->has(gpu) ? gpu : -1,
                                        piece_bytes_, &held_));
  return stage;
}

absl::StatusOr<std::shared_ptr<uint8_t>> CudaDeviceStager::AllocatePinned(
    int nic, uint64_t bytes) {
  const int gpu = nic < static_cast<int>(nic_gpu_.size()) ? nic_gpu_[nic] : -1;
  FL_ASSIGN_OR_RETURN(gpu::PinnedHostBuffer buffer,
                      gpu::PinnedHostBuffer::Allocate(
                          runtime_->context(runtime_->has(gpu) ? gpu : 0), bytes));
  held_.host.fetch_add(bytes, std::memory_order_relaxed);
  auto owner = std::make_shared<gpu::PinnedHostBuffer>(std::move(buffer));
  uint8_t* data = static_cast<uint8_t*>(owner->data());
  return std::shared_ptr<uint8_t>(data, [owner, bytes, held = &held_](uint8_t*) {
    held->host.fetch_sub(bytes, std::memory_order_relaxed);
  });
}

absl::StatusOr<fabric::DmabufRange> CudaDeviceStager::ExportDmabuf(int gpu,
                                                                   uint64_t address,
                                                                   uint64_t bytes) {
  if (!runtime_->has(gpu)) {
    return absl::FailedPreconditionError(absl::StrCat("no GPU ", gpu, " here"));
  }
  FL_ASSIGN_OR_RETURN(gpu::DmabufRange range,
                      gpu::ExportDmabuf(runtime_->context(gpu), address, bytes));
  return fabric::DmabufRange{
      .fd = std::move(range.fd), .offset = range.offset, .bytes = range.bytes};
}

absl::StatusOr<std::shared_ptr<const void>> CudaDeviceStager::AllocateProbe(
    int gpu, uint64_t bytes, uint64_t* address) {
  if (!runtime_->has(gpu)) {
    return absl::FailedPreconditionError(absl::StrCat("no GPU ", gpu, " here"));
  }
  FL_ASSIGN_OR_RETURN(gpu::DeviceBuffer buffer,
                      gpu::DeviceBuffer::Allocate(runtime_->context(gpu), bytes));
  *address = buffer.ptr();
  return std::shared_ptr<const void>(
      std::make_shared<gpu::DeviceBuffer>(std::move(buffer)));
}

void CudaDeviceStager::ReportStats(stats::Sink& sink) const {
  static constexpr stats::Family kDeviceBytes{
      "fuselink_stage_device_bytes",
      "Device memory of the fabric's GPU staging: landing buffers for bytes that arrive "
      "on one GPU's NIC for another GPU.",
      stats::Kind::kGauge};
  static constexpr stats::Family kPinnedBytes{
      "fuselink_stage_pinned_host_bytes",
      "Pinned host buffers the fabric moves GPU bytes through.", stats::Kind::kGauge};
  sink.Add(kDeviceBytes, static_cast<double>(device_bytes()));
  sink.Add(kPinnedBytes, static_cast<double>(pinned_host_bytes()));
}

}  // namespace fuselink::relay
