// Checks of Agent requests that need neither the node nor the engine, made by the
// Agent service before it hands a request on. Pure: no gRPC, no state.
#pragma once

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "fuselink/v1/agent.pb.h"

namespace fuselink::services {

// The largest google.protobuf.Timestamp nanos.
inline constexpr int32_t kMaxTimestampNanos = 999'999'999;

// A TransferRequest's deadline. Absent: no deadline. nanos outside
// 0..kMaxTimestampNanos: INVALID_ARGUMENT (BAD_DEADLINE). At or before `now`, however
// far before (seconds before 1970, down to INT64_MIN): DEADLINE_EXCEEDED (DEADLINE),
// before anything is reserved for the transfer. Seconds past any representable time
// are a deadline that never comes.
absl::Status CheckDeadline(const v1::TransferRequest& request, absl::Time now);

}  // namespace fuselink::services
