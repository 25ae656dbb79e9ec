// Calls whose request is given as bytes: what a client that does not use protobuf, or
// a hostile one, may send. Through grpc::GenericStub, so that nothing on this side
// parses or checks the bytes.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/calls.h"

namespace fuselink::testing {

struct RawResult {
  grpc::Status status;
  std::vector<std::string> responses;  // serialized, in order
};

// Sends `request` to `method` ("/fuselink.v1.Agent/GetTensor") at `address` and
// reads every response until the status. Unary and server-streaming methods alike.
RawResult RawCall(const std::string& address, const std::string& method,
                  const std::string& request, absl::Duration timeout = kCallTimeout);

// `bytes` with its only occurrence of `marker` replaced by `with`, of equal length:
// a message serialized with a placeholder in a string field, then given bytes that
// protobuf's serializer would refuse. Fails the test, and returns empty, when the
// marker is not there exactly once.
std::string Replace(std::string bytes, absl::string_view marker, absl::string_view with);

}  // namespace fuselink::testing
