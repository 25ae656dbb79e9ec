// absl::Status <-> grpc::Status, one-to-one on codes. The reason attached with
// WithReason travels as a google.rpc.ErrorInfo (domain "fuselink.dev") in the
// standard status details, so any gRPC client can read it.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace fuselink {

inline constexpr char kErrorDomain[] = "fuselink.dev";

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace fuselink
