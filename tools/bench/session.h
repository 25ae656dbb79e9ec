// What every workload starts from: the two running agents (source and target) and
// tensors registered on both, backed by memfds this process owns.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "clients/cpp/client.h"
#include "fuselink/v1/agent.grpc.pb.h"

namespace fuselink::bench {

// One agent: its stubs, node name (from GetTopology) and handle socket.
struct AgentHandle {
  std::unique_ptr<v1::Agent::Stub> stub;    // as the caller (a router): transfers
  std::unique_ptr<v1::Agent::Stub> engine;  // as the engine: (un)registers tensors
  std::string address;
  std::string node;
  std::string handle_socket;
  int nics = 0;
};

struct Agents {
  AgentHandle source;
  AgentHandle target;
};

// Connects to both agents and reads their topologies. UNAVAILABLE if either does
// not answer within `timeout`.
absl::StatusOr<Agents> ConnectAgents(const std::string& source_address,
                                     const std::string& source_socket,
                                     const std::string& target_address,
                                     const std::string& target_socket,
                                     absl::Duration timeout);

// A tensor of one layout registered under one name on both agents: the source
// filled with a pattern, the target zeroed. Unregistered from both on destruction
// (best effort: a failure there is printed, not returned). Not thread-safe; the
// buffers may be read from any thread once Create returned.
class TensorPair {
 public:
  static absl::StatusOr<std::unique_ptr<TensorPair>> Create(Agents& agents,
                                                            const std::string& name,
                                                            const v1::Layout& layout);
  ~TensorPair();
  TensorPair(const TensorPair&) = delete;
  TensorPair& operator=(const TensorPair&) = delete;

  const std::string& name() const { return name_; }
  uint64_t bytes() const { return source_->bytes(); }
  // Whether the target holds exactly the source's bytes.
  bool TargetMatchesSource() const;
  // A request moving `block_ids` of every layer to the same blocks on the target.
  v1::TransferRequest Request(const std::string& request_id,
                              const std::vector<uint32_t>& block_ids) const;

 private:
  TensorPair(Agents& agents, std::string name, std::unique_ptr<client::HostBuffer> source,
             std::unique_ptr<client::HostBuffer> target)
      : agents_(agents),
        name_(std::move(name)),
        source_(std::move(source)),
        target_(std::move(target)) {}

  Agents& agents_;
  const std::string name_;
  std::unique_ptr<client::HostBuffer> source_;
  std::unique_ptr<client::HostBuffer> target_;
  bool registered_on_source_ = false;
  bool registered_on_target_ = false;
};

// A request id no earlier run of this process or another has used.
std::string UniqueRequestId(const std::string& tag, uint64_t serial);

}  // namespace fuselink::bench
