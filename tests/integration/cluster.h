// The integration tests' world: agents on loopback (node-b, then node-a peered to
// it), host tensors in memfds of the test process (so the bytes can be checked at the
// far end), requests, and assertions on gRPC errors and their reasons.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/cpp/client.h"
#include "fuselink/v1/agent.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/agent_process.h"

namespace fuselink::testing {

inline constexpr char kNodeA[] = "node-a";
inline constexpr char kNodeB[] = "node-b";

// A layout with explicit strides (0: packed).
v1::Layout MakeLayout(uint32_t layers, uint32_t blocks_per_layer, uint64_t block_bytes,
                      uint64_t block_stride_bytes = 0, uint64_t layer_stride_bytes = 0);

// A tensor in a memfd of this process, registered with an agent: what the agent
// writes into it is visible here.
struct HostTensor {
  std::string name;
  v1::Layout layout;  // strides filled in
  std::unique_ptr<client::HostBuffer> buffer;

  std::span<uint8_t> Block(uint32_t layer, uint32_t block) const;
};

// A memfd big enough for `layout`, filled with client::FillPattern(seed), registered
// with `agent` under `name`.
absl::StatusOr<HostTensor> RegisterTensor(AgentProcess& agent, const std::string& name,
                                          const v1::Layout& layout, uint64_t seed,
                                          uint32_t home_gpu = 0, int owner_pidfd = -1);
// The same through `stub`, whose identity then owns the tensor (pki.h).
absl::StatusOr<HostTensor> RegisterTensorAs(v1::Agent::Stub& stub, AgentProcess& agent,
                                            const std::string& name,
                                            const v1::Layout& layout, uint64_t seed);

// What `target` must hold after moving source_ids[i] to target_ids[i] in layers
// [layer_begin, layer_end): `before` with those blocks replaced.
std::vector<uint8_t> Expected(const HostTensor& source, const HostTensor& target,
                              std::vector<uint8_t> before,
                              const std::vector<uint32_t>& source_ids,
                              const std::vector<uint32_t>& target_ids,
                              uint32_t layer_begin, uint32_t layer_end);
// The tensor's bytes now.
std::vector<uint8_t> Snapshot(const HostTensor& tensor);
// The tensor's memory equals `expected`, or where the first difference is.
::testing::AssertionResult Holds(const HostTensor& tensor,
                                 const std::vector<uint8_t>& expected);

// A request moving source_blocks[i] of node-a's `source` to target_blocks[i] of
// node-b's `target`, in every layer.
v1::TransferRequest MakeRequest(const std::string& request_id, const std::string& source,
                                std::vector<uint32_t> source_blocks,
                                const std::string& target,
                                std::vector<uint32_t> target_blocks);

// OK, or why `status` does not have `code` and `reason`.
::testing::AssertionResult HasError(const grpc::Status& status, grpc::StatusCode code,
                                    const std::string& reason);
// The agent answers GetTopology, so it still serves.
::testing::AssertionResult Serves(AgentProcess& agent);

grpc::Status GetTopology(AgentProcess& agent, v1::Topology* topology);
grpc::Status UnregisterTensor(AgentProcess& agent, const std::string& name);
// The same through `stub`: only the tensor's owner may.
grpc::Status UnregisterTensor(v1::Agent::Stub& stub, const std::string& name);

// Each test gets a directory of its own and starts the agents it needs; their logs
// are printed when the test fails.
class TwoNodeTest : public ::testing::Test {
 protected:
  void TearDown() override;

  // Starts node-b with `b_flags`, then node-a with `a_flags` and
  // --peer=node-b=<b>[,<extra_peers>]. Fails the test (fatally) if either does not
  // start.
  void StartNodes(const std::vector<std::string>& a_flags = {},
                  const std::vector<std::string>& b_flags = {},
                  const std::string& extra_peers = "");
  // The same, with node-b told of node-a too (--peer), as a cluster's agents all know
  // each other: node-a listens on a port picked before either starts.
  void StartMutualNodes(const std::vector<std::string>& a_flags = {},
                        const std::vector<std::string>& b_flags = {});
  // Prints the logs of `a_` and `b_` (and any agents a test adds here).
  void PrintLogs();

  TempDir dir_;
  std::unique_ptr<AgentProcess> b_;
  std::unique_ptr<AgentProcess> a_;
  std::vector<std::string> retired_logs_;  // logs of agents a test replaced
};

}  // namespace fuselink::testing
