#include "services/grpc/agent_service.h"

#include <utility>

#include "agent/common/status_macros.h"
#include "services/grpc/agent_service_internal.h"
#include "services/grpc/answer_off_thread.h"

namespace fuselink::services {
namespace {

using agent_service_internal::kSeeAll;
using security::Bit;
using security::Role;

}  // namespace

AgentService::AgentService(AgentServiceParts parts) : parts_(std::move(parts)) {
  Check("RegisterTensor", &AgentService::RegisterTensor);
  Check("UnregisterTensor", &AgentService::UnregisterTensor);
  Check("GetTensor", &AgentService::GetTensor);
  Check("ListTensors", &AgentService::ListTensors);
  Check("TransferKVCache", &AgentService::TransferKVCache);
  Check("GetTransfer", &AgentService::GetTransfer);
  Check("CancelTransfer", &AgentService::CancelTransfer);
  Check("LayersReady", &AgentService::LayersReady);
  Check("ExtendLease", &AgentService::ExtendLease);
  Check("WatchTransfers", &AgentService::WatchTransfers);
  Check("GetTopology", &AgentService::GetTopology);
}

absl::StatusOr<security::Caller> AgentService::Authorize(
    grpc::CallbackServerContext* context, security::Roles any_of,
    absl::string_view action) {
  security::Guard& guard = *parts_.guard;
  FL_ASSIGN_OR_RETURN(security::Caller caller,
                      guard.Identify(context->auth_context().get()));
  FL_RETURN_IF_ERROR(guard.Require(caller, any_of, action));
  return caller;
}

grpc::ServerUnaryReactor* AgentService::GetTopology(grpc::CallbackServerContext* context,
                                                    const v1::GetTopologyRequest*,
                                                    v1::Topology* response) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, kSeeAll | Bit(Role::kEngine), "read the topology");
  if (!caller.ok()) return Answer(context, caller.status());
  *response = *parts_.topology;
  return Answer(context, absl::OkStatus());
}

}  // namespace fuselink::services
