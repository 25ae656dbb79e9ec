// What the Agent service's three files share: agent_service.cc (the service, who may
// call what, GetTopology), agent_service_tensors.cc (the tensor calls) and
// agent_service_transfers.cc (the transfer calls and WatchTransfers). Internal to
// fuselink_services; callers use agent_service.h.
#pragma once

#include "absl/status/status.h"
#include "agent/common/grpc_status.h"
#include "agent/security/policy.h"
#include "grpcpp/grpcpp.h"

namespace fuselink::services::agent_service_internal {

// Roles that see every tensor.
inline constexpr security::Roles kSeeAll =
    security::Bit(security::Role::kRouter) | security::Bit(security::Role::kViewer);

inline grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                        const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace fuselink::services::agent_service_internal
