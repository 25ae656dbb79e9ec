// fuselinkctl's subcommands. Each returns the process exit code.
#pragma once

#include <string>
#include <vector>

#include "fuselink/v1/agent.grpc.pb.h"

namespace fuselink::ctl {

struct Context {
  std::unique_ptr<v1::Agent::Stub> agent;
  std::string agent_address;
  bool json = false;
};

int Topology(Context& ctx);
// `topology --sysfs_root=DIR`: discovery on this machine, no agent.
int OfflineTopology(bool json);
int Tensors(Context& ctx);
int Tensor(Context& ctx, const std::vector<std::string>& args);
int Transfer(Context& ctx, const std::vector<std::string>& args);
int Status(Context& ctx, const std::vector<std::string>& args);
int Cancel(Context& ctx, const std::vector<std::string>& args);
int Watch(Context& ctx);
int Demo(Context& ctx);
// top.cc
int Top(Context& ctx);

}  // namespace fuselink::ctl
