// The in-node lane's GPU copies (fabric/in_node_fabric.h) on CUDA: one stream per
// GPU it touches, made on first use. GPU to GPU crosses NVLink (or PCIe P2P) when the
// runtime enabled peer access between the two, else the driver stages it; host memory
// to and from a GPU crosses that GPU's PCIe link. Wait synchronizes the streams the
// copies since the last Wait used. Used by one thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "agent/fabric/in_node/fabric.h"
#include "agent/gpu/runtime.h"
#include "agent/gpu/stream.h"

namespace fuselink::relay {

class CudaCopier final : public fabric::DeviceCopier {
 public:
  // `runtime` outlives the copier.
  explicit CudaCopier(const gpu::Runtime* runtime)
      : runtime_(runtime), streams_(runtime->count()), busy_(runtime->count()) {}

  absl::Status Start(const fabric::Place& to, const fabric::Place& from,
                     uint64_t bytes) override;
  absl::Status Wait() override;

 private:
  absl::StatusOr<gpu::Stream*> StreamOf(int gpu);

  const gpu::Runtime* const runtime_;
  std::vector<std::optional<gpu::Stream>> streams_;
  std::vector<bool> busy_;  // by GPU: copies started since the last Wait
};

}  // namespace fuselink::relay
