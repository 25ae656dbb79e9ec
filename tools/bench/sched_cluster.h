// What the scheduler workloads run on: for each policy, one agent per testbed node
// (started by scripts/bench-testbed.sh, each with the other as peer), tensors with a
// home GPU on any of them, transfers run to their end, and each agent's /metrics
// read over plain HTTP.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clients/cpp/client.h"
#include "fuselink/v1/agent.grpc.pb.h"
#include "tools/bench/session.h"

namespace fuselink::bench {

// One agent, from the ready file it wrote (--ready_file).
struct NodeAgent {
  std::unique_ptr<v1::Agent::Stub> stub;    // as the caller (a router): transfers
  std::unique_ptr<v1::Agent::Stub> engine;  // as the engine: (un)registers tensors
  std::string node;
  std::string grpc;
  std::string metrics_url;  // http://host:port/metrics
  std::string handle_socket;
  std::vector<std::string> nic_names;  // in topology order; NIC k owned by GPU k
};

// The agents of one policy, node 0 first.
struct Cluster {
  std::string policy;
  std::vector<NodeAgent> nodes;
};

// Reads DIR/<policy>-n<i>.json for i < `nodes` and connects to each agent.
absl::StatusOr<Cluster> LoadCluster(const std::string& dir, const std::string& policy,
                                    int nodes, absl::Duration timeout);

// A memfd tensor of `layers` x `blocks` x `block_bytes` registered on one agent
// with a home GPU. Filled with a pattern (`fill`) or zeroed. Unregistered on
// destruction (best effort).
class HomedTensor {
 public:
  static absl::StatusOr<std::unique_ptr<HomedTensor>> Create(
      NodeAgent& agent, const std::string& name, uint32_t layers, uint32_t blocks,
      uint64_t block_bytes, uint32_t home_gpu, bool fill);
  ~HomedTensor();
  HomedTensor(const HomedTensor&) = delete;
  HomedTensor& operator=(const HomedTensor&) = delete;

  const std::string& name() const { return name_; }
  const NodeAgent& agent() const { return agent_; }
  uint32_t layers() const { return layers_; }
  uint64_t block_bytes() const { return block_bytes_; }
  uint64_t bytes() const { return buffer_->bytes(); }
  const uint8_t* data() const { return buffer_->data(); }
  // Bytes of block `block` of layer `layer`.
  const uint8_t* block(uint32_t layer, uint32_t block) const;

 private:
  HomedTensor(NodeAgent& agent, std::string name, uint32_t layers, uint32_t blocks,
              uint64_t block_bytes, std::unique_ptr<client::HostBuffer> buffer)
      : agent_(agent),
        name_(std::move(name)),
        layers_(layers),
        blocks_(blocks),
        block_bytes_(block_bytes),
        buffer_(std::move(buffer)) {}
  NodeAgent& agent_;
  const std::string name_;
  const uint32_t layers_, blocks_;
  const uint64_t block_bytes_;
  std::unique_ptr<client::HostBuffer> buffer_;
  bool registered_ = false;
};

// Blocks [source_begin, +count) of every layer of `source` into blocks
// [target_begin, +count) of `target` (same layer count).
v1::TransferRequest BlockRequest(const std::string& request_id, const HomedTensor& source,
                                 uint32_t source_begin, const HomedTensor& target,
                                 uint32_t target_begin, uint32_t count);
// Whether the target's blocks hold the source's, as BlockRequest moved them.
bool BlocksMatch(const HomedTensor& source, uint32_t source_begin,
                 const HomedTensor& target, uint32_t target_begin, uint32_t count);

// One transfer run to its end, timed by the client.
struct TransferTimes {
  absl::Time start;
  absl::Time accepted;
  absl::Time completed;
  std::vector<uint64_t> nic_bytes;  // the completed event's per-NIC split
  double seconds() const { return absl::ToDoubleSeconds(completed - start); }
};
// `on_event` (may be empty) sees every event, on the calling thread.
absl::StatusOr<TransferTimes> RunToEnd(
    NodeAgent& source, const v1::TransferRequest& request,
    const std::function<void(const v1::TransferEvent&)>& on_event = {});

}  // namespace fuselink::bench
