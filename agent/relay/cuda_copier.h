// The in-node lane's GPU copies (fabric/in_node_fabric.h) on CUDA: one stream per
// GPU it touches, made on first use. GPU to GPU crosses NVLink (or PCIe P2P) when the
// runtime enabled peer access between the two, else the driver stages it; host memory
// to and from a GPU crosses that GPU's PCIe link. Wait waits, within the node's copy
// bound, for the streams the copies since the last Wait used. Used by one thread at a
// time.
#pragma once

#include <memory>
#include <vector>

#include "agent/fabric/in_node/fabric.h"
#include "agent/gpu/copy_bound.h"
#include "agent/gpu/runtime.h"
#include "agent/gpu/stream_set.h"

namespace fuselink::relay {

class CudaCopier final : public fabric::DeviceCopier {
 public:
  // `runtime` and `bound` outlive the copier.
  CudaCopier(const gpu::Runtime* runtime, gpu::CopyBound* bound)
      : streams_(std::make_unique<gpu::StreamSet>(runtime, bound)) {}
  // A copier that goes while a copy past its bound may still run hands its streams
  // and what it keeps to gpu::KeepUntilIdle.
  ~CudaCopier() override;

  absl::Status Start(const fabric::Place& to, const fabric::Place& from,
                     uint64_t bytes) override;
  absl::Status Wait() override;
  void KeepWhileBusy(std::shared_ptr<const void> memory) override;

 private:
  std::unique_ptr<gpu::StreamSet> streams_;
  std::vector<std::shared_ptr<const void>> kept_;
};

}  // namespace fuselink::relay
