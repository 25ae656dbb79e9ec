// fuselinkctl's subcommands. Each returns the process exit code.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fuselink/v1/agent.grpc.pb.h"

namespace fuselink::ctl {

struct Context {
  std::unique_ptr<v1::Agent::Stub> agent;
  std::string agent_address;
  bool json = false;
};

// Shared by the subcommands: an error to stderr (exit code 1); a call bounded by 10 s;
// a byte count for people; a transfer run to its end, its progress drawn (or its
// events printed as JSON), each event also handed to `also`.
int Failed(const grpc::Status& status);
int FailedStatus(const absl::Status& status);
template <typename Fn>
grpc::Status Call(Fn fn) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return fn(&context);
}
std::string Bytes(double b);
int Follow(Context& ctx, const v1::TransferRequest& request,
           const std::function<void(const v1::TransferEvent&)>& also = {});

int Topology(Context& ctx);
// `topology --sysfs_root=DIR`: discovery on this machine, no agent.
int OfflineTopology(bool json);
int Tensors(Context& ctx);
int Tensor(Context& ctx, const std::vector<std::string>& args);
int Transfer(Context& ctx, const std::vector<std::string>& args);
int Status(Context& ctx, const std::vector<std::string>& args);
int Cancel(Context& ctx, const std::vector<std::string>& args);
int Watch(Context& ctx);
// demo.cc
int Demo(Context& ctx);
// top.cc
int Top(Context& ctx);

}  // namespace fuselink::ctl
