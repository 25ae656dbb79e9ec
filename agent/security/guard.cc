#include "agent/security/guard.h"

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::security {

const Reason& RefusalReason(Refusal refusal) {
  switch (refusal) {
    case Refusal::kNoClientCertificate:
      return reasons::kNoClientCertificate;
    case Refusal::kNoIdentity:
      return reasons::kNoIdentity;
    case Refusal::kRoleRequired:
      return reasons::kRoleRequired;
    case Refusal::kNodeMismatch:
      return reasons::kNodeMismatch;
    case Refusal::kNotOwner:
      return reasons::kNotOwner;
    case Refusal::kTensorAccess:
      return reasons::kTensorAccess;
    case Refusal::kCount:
      break;
  }
  return reasons::kRoleRequired;  // unreachable: kCount is no refusal
}

absl::Status Guard::Refuse(Refusal refusal, absl::Status status) {
  refusals_[static_cast<size_t>(refusal)].fetch_add(1, std::memory_order_relaxed);
  return WithReason(std::move(status), RefusalReason(refusal));
}

absl::StatusOr<Caller> Guard::Identify(const grpc::AuthContext* auth) {
  if (open_) return Caller::Open();
  std::vector<absl::string_view> ids;
  if (auth != nullptr) {
    for (const grpc::string_ref& id : auth->FindPropertyValues("peer_spiffe_id")) {
      ids.emplace_back(id.data(), id.size());
    }
  }
  return Identify(auth != nullptr && !auth->FindPropertyValues("x509_pem_cert").empty(),
                  ids);
}

absl::StatusOr<Caller> Guard::Identify(bool has_certificate,
                                       const std::vector<absl::string_view>& spiffe_ids) {
  if (open_) return Caller::Open();
  // The TLS layer verified the chain to our CA before the call began; a peer with
  // no certificate at all gets this far (the server requests, and verifies, one).
  if (!has_certificate) {
    return Refuse(Refusal::kNoClientCertificate,
                  absl::UnauthenticatedError(
                      "this agent takes calls only with a client certificate of its CA"));
  }
  if (spiffe_ids.size() != 1 || spiffe_ids[0].empty() ||
      spiffe_ids[0].size() > kMaxIdentityBytes) {
    return Refuse(Refusal::kNoIdentity,
                  absl::UnauthenticatedError("the client certificate names no SPIFFE ID "
                                             "(one URI SAN spiffe://...)"));
  }
  return CallerOf(spiffe_ids[0]);
}

Caller Guard::CallerOf(absl::string_view identity) const {
  if (open_) return Caller::Open();
  return Caller{.identity = std::string(identity),
                .roles = policy_.RolesOf(identity),
                .open = false};
}

absl::Status Guard::Require(const Caller& caller, Roles any_of,
                            absl::string_view action) {
  if (caller.Has(any_of)) return absl::OkStatus();
  std::string roles;
  for (Role r : {Role::kRouter, Role::kEngine, Role::kPeer, Role::kViewer}) {
    if (any_of & Bit(r))
      absl::StrAppend(&roles, roles.empty() ? "" : " or ", RoleName(r));
  }
  return Refuse(Refusal::kRoleRequired, absl::PermissionDeniedError(absl::StrCat(
                                            BoundedForMessage(caller.identity),
                                            " may not ", action, ": needs ", roles)));
}

absl::Status Guard::RequireNode(const Caller& caller, absl::string_view claimed) {
  if (caller.open) return absl::OkStatus();
  if (policy_.NodeOf(caller.identity) == claimed) return absl::OkStatus();
  return Refuse(Refusal::kNodeMismatch,
                absl::PermissionDeniedError(absl::StrCat(
                    BoundedForMessage(caller.identity), " may not speak for node '",
                    BoundedForMessage(claimed), "'")));
}

absl::Status Guard::RequireOwner(const Caller& caller, absl::string_view owner,
                                 absl::string_view name) {
  if (caller.open || caller.identity == owner) return absl::OkStatus();
  // The owner is not named: one engine learns nothing of another.
  return Refuse(Refusal::kNotOwner, absl::PermissionDeniedError(
                                        absl::StrCat("tensor '", BoundedForMessage(name),
                                                     "' belongs to another identity")));
}

absl::Status Guard::RequireGrant(const Caller& caller, absl::string_view owner,
                                 const std::vector<std::string>& grants,
                                 absl::string_view direction, absl::string_view name) {
  if (Granted(caller, owner, grants)) return absl::OkStatus();
  return Refuse(Refusal::kTensorAccess,
                absl::PermissionDeniedError(absl::StrCat(
                    BoundedForMessage(caller.identity.empty() ? "an unnamed caller"
                                                              : caller.identity),
                    " may not move data ", direction, " tensor '", name, "'")));
}

std::vector<std::pair<absl::string_view, uint64_t>> Guard::refusals() const {
  std::vector<std::pair<absl::string_view, uint64_t>> out;
  for (size_t i = 0; i < refusals_.size(); ++i) {
    out.emplace_back(RefusalReason(static_cast<Refusal>(i)).name, refusals_[i].load());
  }
  return out;
}

void Guard::ReportStats(stats::Sink& sink) const {
  static constexpr stats::Family kPlaintext{
      "fuselink_plaintext",
      "1 when the agent runs with --plaintext: no TLS and no authentication; anyone may "
      "do anything.",
      stats::Kind::kGauge};
  static constexpr stats::Family kRefusals{
      "fuselink_access_refusals_total",
      "gRPC calls refused by access control, by reason (UNAUTHENTICATED: "
      "NO_CLIENT_CERTIFICATE, NO_IDENTITY; PERMISSION_DENIED: the others).",
      stats::Kind::kCounter};
  sink.Add(kPlaintext, open() ? 1 : 0);
  sink.Declare(kRefusals);
  for (const auto& [reason, n] : refusals()) {
    sink.Add(kRefusals, {{"reason", std::string(reason)}}, static_cast<double>(n));
  }
}

}  // namespace fuselink::security
