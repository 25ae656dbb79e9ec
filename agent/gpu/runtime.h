// The node's GPUs as the agent uses them: a retained primary context per GPU and peer
// access between every pair that has a path. Topology GPU i is CUDA device i; a
// topology may name more GPUs than the machine has (emulated nodes), and those have no
// context here. Created once at start; immutable afterwards, so any thread may read it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/gpu/device.h"
#include "agent/gpu/driver.h"

namespace fuselink::gpu {

class Runtime {
 public:
  // Opens CUDA devices 0 .. min(topology_gpus, device count) - 1. FAILED_PRECONDITION
  // with the driver's reason when there is no driver or no device.
  static absl::StatusOr<std::unique_ptr<Runtime>> Open(int topology_gpus);

  const Driver& driver() const { return *driver_; }
  // GPUs with a context: 0 .. count() - 1.
  int count() const { return static_cast<int>(contexts_.size()); }
  bool has(int gpu) const { return gpu >= 0 && gpu < count(); }
  const PrimaryContext& context(int gpu) const { return contexts_[gpu]; }
  const DeviceInfo& info(int gpu) const { return infos_[gpu]; }
  // Whether every pair of GPUs here reaches the other's memory directly.
  bool all_peers() const { return all_peers_; }
  // One line per GPU, for the agent's start-up log.
  std::string Describe() const;

 private:
  Runtime() = default;
  const Driver* driver_ = nullptr;
  std::vector<PrimaryContext> contexts_;
  std::vector<DeviceInfo> infos_;
  bool all_peers_ = true;
};

}  // namespace fuselink::gpu
