#include "agent/common/grpc_status.h"

#include "agent/common/status_macros.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"

namespace fuselink {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  google::rpc::Status details;
  details.set_code(static_cast<int>(status.code()));
  details.set_message(std::string(status.message()));
  if (std::string reason = ReasonOf(status); !reason.empty()) {
    google::rpc::ErrorInfo info;
    info.set_reason(reason);
    info.set_domain(kErrorDomain);
    details.add_details()->PackFrom(info);
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()), details.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()),
                   status.error_message());
  google::rpc::Status details;
  if (!status.error_details().empty() &&
      details.ParseFromString(status.error_details())) {
    for (const auto& any : details.details()) {
      google::rpc::ErrorInfo info;
      if (any.UnpackTo(&info) && !info.reason().empty()) {
        return WithForeignReason(std::move(out), info.reason());
      }
    }
  }
  return out;
}

}  // namespace fuselink
