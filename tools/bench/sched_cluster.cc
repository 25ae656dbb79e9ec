#include "tools/bench/sched_cluster.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"
#include "agent/common/unique_fd.h"
#include "clients/cpp/dial.h"
#include "grpcpp/grpcpp.h"

namespace fuselink::bench {

absl::StatusOr<Cluster> LoadCluster(const std::string& dir, const std::string& policy,
                                    int nodes, absl::Duration timeout) {
  Cluster cluster;
  cluster.policy = policy;
  for (int i = 0; i < nodes; ++i) {
    const std::string path = absl::StrCat(dir, "/", policy, "-n", i, ".json");
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    NodeAgent agent;
    agent.grpc = client::ReadyField(text.str(), "grpc");
    agent.metrics_url = client::ReadyField(text.str(), "metrics");
    agent.handle_socket = client::ReadyField(text.str(), "handle_socket");
    if (agent.grpc.empty() || agent.metrics_url.empty() || agent.handle_socket.empty()) {
      return absl::NotFoundError(absl::StrCat("no agent ready file at ", path));
    }
    FL_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                        client::DialAgent(agent.grpc));
    FL_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> engine,
                        client::DialAgent(agent.grpc, client::Speaker::kEngine));
    if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
      return absl::UnavailableError(absl::StrCat("no agent answers at ", agent.grpc));
    }
    agent.stub = v1::Agent::NewStub(channel);
    agent.engine = v1::Agent::NewStub(engine);
    v1::Topology topology;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    FL_RETURN_IF_ERROR(FromGrpcStatus(
        agent.stub->GetTopology(&context, v1::GetTopologyRequest(), &topology)));
    agent.node = topology.node();
    for (const v1::Nic& nic : topology.nics()) agent.nic_names.push_back(nic.name());
    cluster.nodes.push_back(std::move(agent));
  }
  return cluster;
}

absl::StatusOr<std::unique_ptr<HomedTensor>> HomedTensor::Create(
    NodeAgent& agent, const std::string& name, uint32_t layers, uint32_t blocks,
    uint64_t block_bytes, uint32_t home_gpu, bool fill) {
  const uint64_t bytes = uint64_t{layers} * blocks * block_bytes;
  FL_ASSIGN_OR_RETURN(auto buffer, client::HostBuffer::Create(name, bytes));
  if (fill) {
    client::FillPattern(buffer->span(), std::random_device{}());
  } else {
    std::memset(buffer->data(), 0, bytes);  // faults the pages in before any transfer
  }
  std::unique_ptr<HomedTensor> t(
      new HomedTensor(agent, name, layers, blocks, block_bytes, std::move(buffer)));
  v1::Layout layout;
  layout.set_layers(layers);
  layout.set_blocks_per_layer(blocks);
  layout.set_block_bytes(block_bytes);
  FL_RETURN_IF_ERROR(client::RegisterHostTensor(*agent.engine, agent.handle_socket, name,
                                                layout, *t->buffer_, home_gpu)
                         .status());
  t->registered_ = true;
  return t;
}

HomedTensor::~HomedTensor() {
  if (!registered_) return;
  if (absl::Status s = client::UnregisterTensor(*agent_.engine, name_); !s.ok()) {
    std::fprintf(stderr, "fuselink-bench: unregister %s on %s: %s\n", name_.c_str(),
                 agent_.node.c_str(), s.ToString().c_str());
  }
}

const uint8_t* HomedTensor::block(uint32_t layer, uint32_t block) const {
  return buffer_->data() + (uint64_t{layer} * blocks_ + block) * block_bytes_;
}

v1::TransferRequest BlockRequest(const std::string& request_id, const HomedTensor& source,
                                 uint32_t source_begin, const HomedTensor& target,
                                 uint32_t target_begin, uint32_t count) {
  v1::TransferRequest request;
  request.set_request_id(request_id);
  request.mutable_source()->set_node(source.agent().node);
  request.mutable_source()->set_tensor(source.name());
  request.mutable_target()->set_node(target.agent().node);
  request.mutable_target()->set_tensor(target.name());
  for (uint32_t i = 0; i < count; ++i) {
    request.mutable_source()->add_block_ids(source_begin + i);
    request.mutable_target()->add_block_ids(target_begin + i);
  }
  return request;
}

bool BlocksMatch(const HomedTensor& source, uint32_t source_begin,
                 const HomedTensor& target, uint32_t target_begin, uint32_t count) {
  for (uint32_t layer = 0; layer < source.layers(); ++layer) {
    if (std::memcmp(source.block(layer, source_begin), target.block(layer, target_begin),
                    count * source.block_bytes()) != 0) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<TransferTimes> RunToEnd(
    NodeAgent& source, const v1::TransferRequest& request,
    const std::function<void(const v1::TransferEvent&)>& on_event) {
  TransferTimes times;
  times.start = absl::Now();
  client::TransferOutcome outcome =
      client::RunTransfer(*source.stub, request, [&](const v1::TransferEvent& e) {
        if (e.has_accepted()) times.accepted = absl::Now();
        if (e.has_completed()) {
          times.completed = absl::Now();
          for (const v1::NicBytes& n : e.completed().per_nic()) {
            times.nic_bytes.push_back(n.bytes());
          }
        }
        if (on_event) on_event(e);
      });
  if (!outcome.status.ok()) return outcome.status;
  if (!outcome.last.has_completed()) {
    return absl::AbortedError(absl::StrCat(
        request.request_id(), " did not complete: ", outcome.last.failed().message(),
        " (", outcome.last.failed().reason(), ")"));
  }
  return times;
}

}  // namespace fuselink::bench
