// NodeOptions::Validate: every field the node is made from, against its range (the
// ranges are node.h's comments and the limits they name).
#include "agent/common/options.h"

#include <algorithm>

#include "agent/common/limits.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/verbs/fabric.h"
#include "agent/fabric/verbs/nic.h"
#include "agent/node/node.h"

namespace fuselink::services {
namespace {

absl::Status ValidateFabric(const NodeOptions& o) {
  FL_RETURN_IF_ERROR(
      InRange("fabric_stall_timeout_ms", o.fabric_stall_timeout_ms, 1, kMaxTimeoutMs));
  FL_RETURN_IF_ERROR(
      InRange("fabric_ack_timeout_ms", o.fabric_ack_timeout_ms, 1, kMaxTimeoutMs));
  FL_RETURN_IF_ERROR(InRange("rdma_traffic_class", o.rdma_traffic_class, 0,
                             fabric::verbs::kMaxTrafficClass));
  FL_RETURN_IF_ERROR(InRange("rdma_service_level", o.rdma_service_level, 0,
                             fabric::verbs::kMaxServiceLevel));
  FL_RETURN_IF_ERROR(InRange("rdma_staging_slots", o.rdma_staging_slots, 1u,
                             fabric::kMaxStagingSlotsPerNic));
  FL_RETURN_IF_ERROR(InRange("rdma_staging_slots_per_peer", o.rdma_staging_slots_per_peer,
                             0u, o.rdma_staging_slots));
  FL_RETURN_IF_ERROR(InRange("rdma_max_shadow_bytes", o.rdma_max_shadow_bytes,
                             uint64_t{1} << 20, kMaxShadowBytes));
  return InRange("rdma_max_qps_per_nic", o.rdma_max_qps_per_nic,
                 std::max(1, o.qps_per_nic),
                 static_cast<int>(fabric::verbs::kMaxQpsPerNic));
}

// The parts' own options, each by its path.
absl::Status ValidateParts(const NodeOptions& o) {
  FL_RETURN_IF_ERROR(WithinField("limits", o.limits.Validate()));
  FL_RETURN_IF_ERROR(WithinField("engine", o.engine.Validate()));
  FL_RETURN_IF_ERROR(WithinField("landing", o.landing.Validate()));
  FL_RETURN_IF_ERROR(WithinField("shares", o.shares.Validate()));
  FL_RETURN_IF_ERROR(WithinField("foreign", o.foreign.Validate()));
  FL_RETURN_IF_ERROR(WithinField("incoming_prepares", o.incoming_prepares.Validate()));
  return WithinField("registrations", o.registrations.Validate());
}

}  // namespace

absl::Status NodeOptions::Validate() const {
  FL_RETURN_IF_ERROR(ValidateFabric(*this));
  FL_RETURN_IF_ERROR(ValidateParts(*this));
  FL_RETURN_IF_ERROR(
      AtLeast<size_t>("max_watches_per_identity", max_watches_per_identity, 1));
  if (gpu != "auto" && gpu != "off") return BadField("gpu", "must be auto or off");
  FL_RETURN_IF_ERROR(
      InRange("gpu_copy_timeout_ms", gpu_copy_timeout_ms, 1, kMaxTimeoutMs));
  FL_RETURN_IF_ERROR(
      InRange("foreign_check", foreign_check, absl::Milliseconds(1), kMaxForeignCheck));
  return InRange("ipc_close_wait", ipc_close_wait, absl::Milliseconds(1),
                 kMaxIpcCloseWait);
}

}  // namespace fuselink::services
