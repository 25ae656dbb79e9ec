// What the Agent service's three files share: agent_service.cc (the service, who may
// call what, GetTopology), agent_service_tensors.cc (the tensor calls) and
// agent_service_transfers.cc (the transfer calls and WatchTransfers). Internal to
// fuselink_services; callers use agent_service.h.
#pragma once

#include "agent/security/policy.h"

namespace fuselink::services::agent_service_internal {

// Roles that see every tensor.
inline constexpr security::Roles kSeeAll =
    security::Bit(security::Role::kRouter) | security::Bit(security::Role::kViewer);

}  // namespace fuselink::services::agent_service_internal
