#include "tools/bench/session.h"

#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"
#include "clients/cpp/dial.h"
#include "grpcpp/grpcpp.h"

namespace fuselink::bench {
namespace {

absl::Status Connect(const std::string& address, const std::string& socket,
                     absl::Duration timeout, AgentHandle* agent) {
  FL_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, client::DialAgent(address));
  FL_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> engine,
                      client::DialAgent(address, client::Speaker::kEngine));
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::UnavailableError(absl::StrCat("no agent answers at ", address));
  }
  agent->stub = v1::Agent::NewStub(channel);
  agent->engine = v1::Agent::NewStub(engine);
  agent->address = address;
  agent->handle_socket = socket;
  v1::Topology topology;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::Status s =
      agent->stub->GetTopology(&context, v1::GetTopologyRequest(), &topology);
  if (!s.ok()) return FromGrpcStatus(s);
  agent->node = topology.node();
  agent->nics = topology.nics_size();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Agents> ConnectAgents(const std::string& source_address,
                                     const std::string& source_socket,
                                     const std::string& target_address,
                                     const std::string& target_socket,
                                     absl::Duration timeout) {
  Agents agents;
  FL_RETURN_IF_ERROR(Connect(source_address, source_socket, timeout, &agents.source));
  FL_RETURN_IF_ERROR(Connect(target_address, target_socket, timeout, &agents.target));
  return agents;
}

absl::StatusOr<std::unique_ptr<TensorPair>> TensorPair::Create(Agents& agents,
                                                               const std::string& name,
                                                               const v1::Layout& layout) {
  const uint64_t bytes =
      uint64_t{layout.layers()} * layout.blocks_per_layer() * layout.block_bytes();
  FL_ASSIGN_OR_RETURN(auto source,
                      client::HostBuffer::Create(absl::StrCat(name, "-source"), bytes));
  FL_ASSIGN_OR_RETURN(auto target,
                      client::HostBuffer::Create(absl::StrCat(name, "-target"), bytes));
  client::FillPattern(source->span(), std::random_device{}());
  // Touches every target page here, so that no transfer pays for allocating them.
  std::memset(target->data(), 0, bytes);
  std::unique_ptr<TensorPair> pair(
      new TensorPair(agents, name, std::move(source), std::move(target)));
  FL_RETURN_IF_ERROR(client::RegisterHostTensor(*agents.source.engine,
                                                agents.source.handle_socket, name, layout,
                                                *pair->source_)
                         .status());
  pair->registered_on_source_ = true;
  FL_RETURN_IF_ERROR(client::RegisterHostTensor(*agents.target.engine,
                                                agents.target.handle_socket, name, layout,
                                                *pair->target_)
                         .status());
  pair->registered_on_target_ = true;
  return pair;
}

TensorPair::~TensorPair() {
  const std::pair<bool, AgentHandle*> sides[] = {
      {registered_on_source_, &agents_.source}, {registered_on_target_, &agents_.target}};
  for (const auto& [registered, agent] : sides) {
    if (!registered) continue;
    if (absl::Status s = client::UnregisterTensor(*agent->engine, name_); !s.ok()) {
      std::fprintf(stderr, "fuselink-bench: unregister %s on %s: %s\n", name_.c_str(),
                   agent->node.c_str(), s.ToString().c_str());
    }
  }
}

bool TensorPair::TargetMatchesSource() const {
  return std::memcmp(source_->data(), target_->data(), source_->bytes()) == 0;
}

v1::TransferRequest TensorPair::Request(const std::string& request_id,
                                        const std::vector<uint32_t>& block_ids) const {
  v1::TransferRequest request;
  request.set_request_id(request_id);
  request.mutable_source()->set_node(agents_.source.node);
  request.mutable_source()->set_tensor(name_);
  request.mutable_target()->set_node(agents_.target.node);
  request.mutable_target()->set_tensor(name_);
  for (uint32_t b : block_ids) {
    request.mutable_source()->add_block_ids(b);
    request.mutable_target()->add_block_ids(b);
  }
  return request;
}

std::string UniqueRequestId(const std::string& tag, uint64_t serial) {
  static const uint64_t run =
      (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  return absl::StrFormat("bench-%016x-%s-%d", run, tag, serial);
}

}  // namespace fuselink::bench
