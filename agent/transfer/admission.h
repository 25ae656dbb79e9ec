// What the source checks of a request on its own, before it admits it: the request
// id, the nodes, the block counts, the source tensor with its blocks and layers, and
// the deadline. Also the request's identity for idempotency (its fingerprint). Errors
// quote at most kMaxEchoBytes of any client string.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/memory/registry.h"
#include "agent/transfer/peer_link.h"
#include "fuselink/v1/agent.pb.h"

namespace fuselink::transfer {

// Request ids are 1 to kMaxRequestIdBytes bytes.
inline constexpr size_t kMaxRequestIdBytes = 128;

// INVALID_ARGUMENT (BAD_REQUEST_ID).
absl::Status CheckRequestId(absl::string_view request_id);
// The longest lease (TransferRequest.lease_ms, ExtendLease).
inline constexpr uint32_t kMaxLeaseMs = 600'000;
// INVALID_ARGUMENT (BAD_LEASE) past kMaxLeaseMs.
absl::Status CheckLeaseMs(uint32_t lease_ms);
// The nodes (the source is `local_node`, the target a node `peers` knows; this one
// only with `in_node`) and the block counts. An in-node move within one tensor names
// no block on both sides (INVALID_ARGUMENT, SAME_BLOCKS): it would copy onto itself.
absl::Status CheckNodes(const v1::TransferRequest& request, absl::string_view local_node,
                        const PeerLink& peers, bool in_node = false);
// Pins the source tensor and checks the request's blocks and layers against it.
absl::StatusOr<memory::TensorLease> PinSource(const v1::TransferRequest& request,
                                              memory::Registry& registry);

// The request's content without its deadline: a retry may carry a new deadline and
// still be the same request.
std::string Fingerprint(const v1::TransferRequest& request);
// The request's own deadline; InfiniteFuture when it has none.
absl::Time RequestDeadline(const v1::TransferRequest& request);

// DEADLINE_EXCEEDED (DEADLINE): the deadline is now or past.
absl::Status DeadlineStatus();
// DEADLINE_EXCEEDED (LEASE_EXPIRED): nobody renewed the transfer's lease in time.
absl::Status LeaseExpiredStatus();
// UNAVAILABLE (SHUTTING_DOWN).
absl::Status ShuttingDownStatus();

}  // namespace fuselink::transfer
