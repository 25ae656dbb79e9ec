// What the Agent service checks of a request before anything else sees it, on any
// bytes (services/grpc/request_utf8.h, request_checks.h): the UTF-8 walk never crashes,
// agrees with protobuf's parser (what parses walks OK; BAD_UTF8 never parses), and a
// parsed TransferRequest's deadline is judged as its fields say. BoundedForMessage
// on the same bytes stays within its bound.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>

#include "agent/common/status_macros.h"
#include "fuselink/v1/agent.pb.h"
#include "google/protobuf/message.h"
#include "services/grpc/request_checks.h"
#include "services/grpc/request_utf8.h"
#include "tests/fuzz/fuzz_check.h"

namespace fuselink::services {
namespace {

const google::protobuf::Message* const kTypes[] = {
    &v1::TransferRequest::default_instance(),
    &v1::RegisterTensorRequest::default_instance(),
    &v1::GetTensorRequest::default_instance(),
    &v1::UnregisterTensorRequest::default_instance(),
    &v1::ListTensorsRequest::default_instance(),
    &v1::GetTransferRequest::default_instance(),
    &v1::CancelTransferRequest::default_instance(),
    &v1::LayersReadyRequest::default_instance(),
    &v1::WatchTransfersRequest::default_instance(),
    &v1::GetTopologyRequest::default_instance(),
};
constexpr int64_t kNowSeconds = 1'800'000'000;

void CheckDeadlineOf(const v1::TransferRequest& request) {
  const absl::Status status = CheckDeadline(request, absl::FromUnixSeconds(kNowSeconds));
  if (!request.has_deadline()) {
    FL_FUZZ_CHECK(status.ok());
    return;
  }
  const int64_t seconds = request.deadline().seconds();
  const int32_t nanos = request.deadline().nanos();
  if (nanos < 0 || nanos > kMaxTimestampNanos) {
    FL_FUZZ_CHECK(absl::IsInvalidArgument(status) && ReasonOf(status) == "BAD_DEADLINE");
  } else if (seconds < kNowSeconds || (seconds == kNowSeconds && nanos == 0)) {
    FL_FUZZ_CHECK(absl::IsDeadlineExceeded(status) && ReasonOf(status) == "DEADLINE");
  } else {
    FL_FUZZ_CHECK(status.ok());
  }
}

}  // namespace
}  // namespace fuselink::services

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fuselink;
  using namespace fuselink::services;
  if (size == 0) return 0;
  const google::protobuf::Message& type = *kTypes[data[0] % std::size(kTypes)];
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);

  const absl::Status walked = CheckUtf8Fields(*type.GetDescriptor(), bytes);
  const std::string reason = ReasonOf(walked);
  FL_FUZZ_CHECK(walked.ok() || (absl::IsInvalidArgument(walked) &&
                                (reason == "BAD_UTF8" || reason == "MALFORMED_REQUEST")));
  std::unique_ptr<google::protobuf::Message> message(type.New());
  const bool parsed = message->ParseFromString(bytes);
  if (parsed) FL_FUZZ_CHECK(walked.ok());
  if (reason == "BAD_UTF8") FL_FUZZ_CHECK(!parsed);
  if (parsed && type.GetDescriptor() == v1::TransferRequest::descriptor()) {
    CheckDeadlineOf(static_cast<const v1::TransferRequest&>(*message));
  }

  const std::string echoed = BoundedForMessage(bytes);
  FL_FUZZ_CHECK(echoed.size() <= kMaxEchoBytes);
  for (char c : echoed) FL_FUZZ_CHECK(c >= 0x20 && c < 0x7f);
  return 0;
}
