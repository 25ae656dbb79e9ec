// Applies the policy to calls: who the caller is (from the TLS layer), whether it
// holds a role, owns a tensor, or was granted it. Every refusal goes through here and
// is counted by its reason. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/errors.h"
#include "agent/common/stats.h"
#include "agent/security/policy.h"
#include "grpcpp/security/auth_context.h"

namespace fuselink::security {

// Why a call was refused; each is a label of fuselink_access_refusals_total.
enum class Refusal : uint8_t {
  kNoClientCertificate,  // UNAUTHENTICATED: the TLS peer showed no certificate
  kNoIdentity,           // UNAUTHENTICATED: its certificate names no SPIFFE ID
  kRoleRequired,         // PERMISSION_DENIED: no role that allows the call
  kNodeMismatch,         // PERMISSION_DENIED: a peer spoke for another node
  kNotOwner,             // PERMISSION_DENIED: someone else's tensor
  kTensorAccess,         // PERMISSION_DENIED: not granted the tensor it moves
  kCount,
};
const Reason& RefusalReason(Refusal refusal);

class Guard {
 public:
  // `open`: --plaintext, every caller may do everything.
  Guard(Policy policy, bool open) : policy_(std::move(policy)), open_(open) {}

  bool open() const { return open_; }
  const Policy& policy() const { return policy_; }

  // The caller of a call whose TLS peer is `auth` (null: none).
  absl::StatusOr<Caller> Identify(const grpc::AuthContext* auth);
  // The same from what the TLS layer found: whether the peer showed a certificate,
  // and the SPIFFE IDs in it.
  absl::StatusOr<Caller> Identify(bool has_certificate,
                                  const std::vector<absl::string_view>& spiffe_ids);
  // A caller known by identity only: the requester a peer relays.
  Caller CallerOf(absl::string_view identity) const;

  // PERMISSION_DENIED (ROLE_REQUIRED) unless the caller holds one of `any_of`.
  absl::Status Require(const Caller& caller, Roles any_of, absl::string_view action);
  // PERMISSION_DENIED (NODE_MISMATCH) unless the peer's identity is node `claimed`'s.
  absl::Status RequireNode(const Caller& caller, absl::string_view claimed);
  // PERMISSION_DENIED (NOT_OWNER) unless the caller registered tensor `name`.
  absl::Status RequireOwner(const Caller& caller, absl::string_view owner,
                            absl::string_view name);
  // PERMISSION_DENIED (TENSOR_ACCESS) unless the owner or `grants` allow the caller
  // to move data `direction` ("out of", "into") tensor `name`.
  absl::Status RequireGrant(const Caller& caller, absl::string_view owner,
                            const std::vector<std::string>& grants,
                            absl::string_view direction, absl::string_view name);

  // Refusals so far, by reason, in Refusal order.
  std::vector<std::pair<absl::string_view, uint64_t>> refusals() const;

  // Whether access control is off, and the calls it refused, by reason.
  void ReportStats(stats::Sink& sink) const;

 private:
  absl::Status Refuse(Refusal refusal, absl::Status status);

  const Policy policy_;
  const bool open_;
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Refusal::kCount)> refusals_{};
};

}  // namespace fuselink::security
