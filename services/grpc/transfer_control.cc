#include "services/grpc/transfer_control.h"

#include "absl/strings/str_cat.h"
#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"

namespace fuselink::services {

namespace {

template <typename Request>
v1::ForwardControlRequest Wrap(const Request& request,
                               Request* (v1::ForwardControlRequest::*field)()) {
  v1::ForwardControlRequest call;
  *(call.*field)() = request;
  return call;
}

}  // namespace

v1::ForwardControlRequest ControlOf(const v1::GetTransferRequest& request) {
  return Wrap(request, &v1::ForwardControlRequest::mutable_get);
}

v1::ForwardControlRequest ControlOf(const v1::CancelTransferRequest& request) {
  return Wrap(request, &v1::ForwardControlRequest::mutable_cancel);
}

v1::ForwardControlRequest ControlOf(const v1::LayersReadyRequest& request) {
  return Wrap(request, &v1::ForwardControlRequest::mutable_layers_ready);
}

v1::ForwardControlRequest ControlOf(const v1::ExtendLeaseRequest& request) {
  return Wrap(request, &v1::ForwardControlRequest::mutable_extend_lease);
}

namespace {

// The fields every one of the four requests has.
struct Named {
  const std::string* transfer_id;
  const std::string* request_id;
  const std::string* source_node;
  absl::string_view action;  // for a refusal: "<who> may not <action>"
};

template <typename Request>
Named NamedBy(const Request& r, absl::string_view action) {
  return {&r.transfer_id(), &r.request_id(), &r.source_node(), action};
}

Named NamedBy(const v1::ForwardControlRequest& call) {
  switch (call.call_case()) {
    case v1::ForwardControlRequest::kCancel:
      return NamedBy(call.cancel(), "cancel transfers");
    case v1::ForwardControlRequest::kLayersReady:
      return NamedBy(call.layers_ready(), "tell transfers their layers are ready");
    case v1::ForwardControlRequest::kExtendLease:
      return NamedBy(call.extend_lease(), "renew transfers' leases");
    default:
      return NamedBy(call.get(), "follow transfers");
  }
}

}  // namespace

const std::string& SourceOf(const v1::ForwardControlRequest& call,
                            const std::string& self) {
  const std::string& source = *NamedBy(call).source_node;
  return source.empty() ? self : source;
}

absl::string_view ActionOf(const v1::ForwardControlRequest& call) {
  return NamedBy(call).action;
}

absl::Status RunControl(transfer::Engine& engine, const v1::ForwardControlRequest& call,
                        const security::Caller& caller, v1::TransferStatus* response) {
  if (call.call_case() == v1::ForwardControlRequest::CALL_NOT_SET) {
    return WithReason(absl::InvalidArgumentError("the call names no request"),
                      reasons::kMalformedRequest);
  }
  const Named named = NamedBy(call);
  if (named.transfer_id->empty() && named.request_id->empty()) {
    return WithReason(absl::InvalidArgumentError("give transfer_id or request_id"),
                      reasons::kMissingId);
  }
  FL_ASSIGN_OR_RETURN(
      std::shared_ptr<transfer::Transfer> t,
      engine.Find(*named.transfer_id, *named.request_id, caller.identity));
  // Both ids given: each must be found, and name the same transfer; else the
  // answer would be about one of two transfers, unsaid which.
  if (!named.transfer_id->empty() && !named.request_id->empty()) {
    FL_ASSIGN_OR_RETURN(std::shared_ptr<transfer::Transfer> by_transfer_id,
                        engine.Find(*named.transfer_id, "", caller.identity));
    FL_ASSIGN_OR_RETURN(std::shared_ptr<transfer::Transfer> by_request_id,
                        engine.Find("", *named.request_id, caller.identity));
    if (by_transfer_id != by_request_id) {
      return WithReason(
          absl::InvalidArgumentError(absl::StrCat(
              "transfer_id '", BoundedForMessage(*named.transfer_id),
              "' and request_id '", BoundedForMessage(*named.request_id),
              "' name different transfers: give one of them, or both of one transfer")),
          reasons::kIdsDisagree);
    }
    t = std::move(by_transfer_id);
  }
  absl::Status s;
  switch (call.call_case()) {
    case v1::ForwardControlRequest::kCancel:
      s = engine.Cancel(t);
      break;
    case v1::ForwardControlRequest::kLayersReady:
      s = engine.LayersReady(t, call.layers_ready().ready_end());
      break;
    case v1::ForwardControlRequest::kExtendLease:
      s = engine.ExtendLease(t, call.extend_lease().lease_ms());
      break;
    default:
      break;
  }
  *response = t->Status();
  return s;
}

}  // namespace fuselink::services
