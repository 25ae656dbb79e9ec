#include "tests/integration/cluster.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/calls.h"
#include "tests/integration/net_util.h"

namespace fuselink::testing {

v1::Layout MakeLayout(uint32_t layers, uint32_t blocks_per_layer, uint64_t block_bytes,
                      uint64_t block_stride_bytes, uint64_t layer_stride_bytes) {
  v1::Layout layout;
  layout.set_layers(layers);
  layout.set_blocks_per_layer(blocks_per_layer);
  layout.set_block_bytes(block_bytes);
  layout.set_block_stride_bytes(block_stride_bytes);
  layout.set_layer_stride_bytes(layer_stride_bytes);
  return layout;
}

std::span<uint8_t> HostTensor::Block(uint32_t layer, uint32_t block) const {
  const uint64_t offset =
      layer * layout.layer_stride_bytes() + block * layout.block_stride_bytes();
  return buffer->span().subspan(offset, layout.block_bytes());
}

namespace {

absl::StatusOr<HostTensor> RegisterThrough(v1::Agent::Stub& stub, AgentProcess& agent,
                                           const std::string& name,
                                           const v1::Layout& layout, uint64_t seed,
                                           uint32_t home_gpu, int owner_pidfd) {
  HostTensor tensor;
  tensor.name = name;
  tensor.layout = layout;
  if (tensor.layout.block_stride_bytes() == 0) {
    tensor.layout.set_block_stride_bytes(layout.block_bytes());
  }
  if (tensor.layout.layer_stride_bytes() == 0) {
    tensor.layout.set_layer_stride_bytes(layout.blocks_per_layer() *
                                         tensor.layout.block_stride_bytes());
  }
  const uint64_t extent =
      (layout.layers() - 1) * tensor.layout.layer_stride_bytes() +
      (layout.blocks_per_layer() - 1) * tensor.layout.block_stride_bytes() +
      layout.block_bytes();
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> buffer =
      client::HostBuffer::Create(name, (extent + page - 1) / page * page);
  if (!buffer.ok()) return buffer.status();
  tensor.buffer = *std::move(buffer);
  client::FillPattern(tensor.buffer->span(), seed);
  absl::StatusOr<v1::Tensor> registered = client::RegisterHostTensor(
      stub, agent.handle_socket(), name, layout, *tensor.buffer, home_gpu, owner_pidfd);
  if (!registered.ok()) return registered.status();
  return tensor;
}

}  // namespace

absl::StatusOr<HostTensor> RegisterTensor(AgentProcess& agent, const std::string& name,
                                          const v1::Layout& layout, uint64_t seed,
                                          uint32_t home_gpu, int owner_pidfd) {
  return RegisterThrough(agent.stub(), agent, name, layout, seed, home_gpu, owner_pidfd);
}

absl::StatusOr<HostTensor> RegisterTensorAs(v1::Agent::Stub& stub, AgentProcess& agent,
                                            const std::string& name,
                                            const v1::Layout& layout, uint64_t seed) {
  return RegisterThrough(stub, agent, name, layout, seed, 0, -1);
}

v1::TransferRequest MakeRequest(const std::string& request_id, const std::string& source,
                                std::vector<uint32_t> source_blocks,
                                const std::string& target,
                                std::vector<uint32_t> target_blocks) {
  v1::TransferRequest request;
  request.set_request_id(request_id);
  request.mutable_source()->set_node(kNodeA);
  request.mutable_source()->set_tensor(source);
  *request.mutable_source()->mutable_block_ids() = {source_blocks.begin(),
                                                    source_blocks.end()};
  request.mutable_target()->set_node(kNodeB);
  request.mutable_target()->set_tensor(target);
  *request.mutable_target()->mutable_block_ids() = {target_blocks.begin(),
                                                    target_blocks.end()};
  return request;
}

::testing::AssertionResult HasError(const grpc::Status& status, grpc::StatusCode code,
                                    const std::string& reason) {
  const std::string got_reason = client::ReasonOf(status);
  if (status.error_code() == code && got_reason == reason) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "want code " << code << " reason '" << reason << "', got code "
         << status.error_code() << " reason '" << got_reason
         << "': " << status.error_message();
}

grpc::Status GetTopology(AgentProcess& agent, v1::Topology* topology) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  return agent.stub().GetTopology(&context, v1::GetTopologyRequest(), topology);
}

grpc::Status UnregisterTensor(AgentProcess& agent, const std::string& name) {
  return UnregisterTensor(agent.stub(), name);
}

grpc::Status UnregisterTensor(v1::Agent::Stub& stub, const std::string& name) {
  v1::UnregisterTensorRequest request;
  request.set_name(name);
  v1::UnregisterTensorResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  return stub.UnregisterTensor(&context, request, &response);
}

::testing::AssertionResult Serves(AgentProcess& agent) {
  v1::Topology topology;
  grpc::Status status = GetTopology(agent, &topology);
  if (!status.ok()) {
    return ::testing::AssertionFailure()
           << agent.node() << " does not serve: GetTopology: " << status.error_code()
           << " " << status.error_message();
  }
  if (topology.node() != agent.node()) {
    return ::testing::AssertionFailure()
           << "GetTopology names node '" << topology.node() << "'";
  }
  return ::testing::AssertionSuccess();
}

void TwoNodeTest::StartNodes(const std::vector<std::string>& a_flags,
                             const std::vector<std::string>& b_flags,
                             const std::string& extra_peers) {
  absl::StatusOr<std::unique_ptr<AgentProcess>> b =
      AgentProcess::Start(dir_.path(), kNodeB, b_flags);
  ASSERT_TRUE(b.ok()) << b.status();
  b_ = *std::move(b);
  std::vector<std::string> flags = a_flags;
  std::vector<std::string> peers = {absl::StrCat(kNodeB, "=", b_->grpc_address())};
  if (!extra_peers.empty()) peers.push_back(extra_peers);
  flags.push_back(absl::StrCat("--peer=", absl::StrJoin(peers, ",")));
  absl::StatusOr<std::unique_ptr<AgentProcess>> a =
      AgentProcess::Start(dir_.path(), kNodeA, flags);
  ASSERT_TRUE(a.ok()) << a.status();
  a_ = *std::move(a);
}

void TwoNodeTest::StartMutualNodes(const std::vector<std::string>& a_flags,
                                   const std::vector<std::string>& b_flags) {
  absl::StatusOr<std::string> free = FreeListenAddress();
  ASSERT_TRUE(free.ok()) << free.status();
  const std::string a_address = *free;
  std::vector<std::string> a = a_flags, b = b_flags;
  a.push_back(absl::StrCat("--listen=", a_address));
  b.push_back(absl::StrCat("--peer=", kNodeA, "=", a_address));
  StartNodes(a, b);
}

void TwoNodeTest::PrintLogs() {
  for (const std::string& log : retired_logs_) {
    std::fprintf(stderr, "--- log of a replaced agent:\n%s\n", log.c_str());
  }
  for (AgentProcess* agent : {b_.get(), a_.get()}) {
    if (agent == nullptr) continue;
    std::fprintf(stderr, "--- log of %s (%s):\n%s\n", agent->node().c_str(),
                 agent->log_path().c_str(), agent->Log().c_str());
  }
}

void TwoNodeTest::TearDown() {
  if (HasFailure()) PrintLogs();
  a_.reset();
  b_.reset();
}

// What `target` must hold after moving source_ids[i] to target_ids[i] in layers
// [layer_begin, layer_end): `before` with those blocks replaced.
std::vector<uint8_t> Expected(const HostTensor& source, const HostTensor& target,
                              std::vector<uint8_t> before,
                              const std::vector<uint32_t>& source_ids,
                              const std::vector<uint32_t>& target_ids,
                              uint32_t layer_begin, uint32_t layer_end) {
  for (uint32_t layer = layer_begin; layer < layer_end; ++layer) {
    for (size_t i = 0; i < source_ids.size(); ++i) {
      std::span<const uint8_t> from = source.Block(layer, source_ids[i]);
      std::span<uint8_t> to = target.Block(layer, target_ids[i]);
      std::memcpy(before.data() + (to.data() - target.buffer->data()), from.data(),
                  from.size());
    }
  }
  return before;
}

std::vector<uint8_t> Snapshot(const HostTensor& tensor) {
  return {tensor.buffer->data(), tensor.buffer->data() + tensor.buffer->bytes()};
}

// The tensor's memory equals `expected`, or where the first difference is.
::testing::AssertionResult Holds(const HostTensor& tensor,
                                 const std::vector<uint8_t>& expected) {
  const uint8_t* got = tensor.buffer->data();
  if (std::memcmp(got, expected.data(), expected.size()) == 0) {
    return ::testing::AssertionSuccess();
  }
  size_t at = 0;
  while (got[at] == expected[at]) ++at;
  const uint64_t layer = at / tensor.layout.layer_stride_bytes();
  const uint64_t in_layer = at % tensor.layout.layer_stride_bytes();
  return ::testing::AssertionFailure()
         << tensor.name << " differs first at byte " << at << " (layer " << layer
         << ", block slot " << in_layer / tensor.layout.block_stride_bytes() << ", byte "
         << in_layer % tensor.layout.block_stride_bytes() << ")";
}

}  // namespace fuselink::testing
