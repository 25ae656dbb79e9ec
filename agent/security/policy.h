// Who may do what: identities bound to roles by a policy, and the grants a tensor's
// owner gives. Pure: no TLS, no gRPC; the guard (guard.h) applies it to calls.
//
// An identity is what a client's certificate proves: its SPIFFE ID (one URI SAN,
// "spiffe://fuselink/router/r1"). docs/security.md has the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fuselink/v1/policy.pb.h"

namespace fuselink::security {

enum class Role : uint8_t {
  kRouter = 1 << 0,  // TransferKVCache, GetTransfer, CancelTransfer, WatchTransfers
  kEngine = 1 << 1,  // RegisterTensor; UnregisterTensor and watches of its own
  kPeer = 1 << 2,    // the Peer service
  kViewer = 1 << 3,  // GetTopology, GetTensor, ListTensors
};
using Roles = uint8_t;
constexpr Roles Bit(Role role) { return static_cast<Roles>(role); }
inline constexpr Roles kAllRoles =
    Bit(Role::kRouter) | Bit(Role::kEngine) | Bit(Role::kPeer) | Bit(Role::kViewer);

// "router", "engine", "peer", "viewer".
absl::string_view RoleName(Role role);
std::optional<Role> ParseRole(absl::string_view name);

// Bounds on what a policy file or a registration may hold.
inline constexpr size_t kMaxIdentityBytes = 512;
inline constexpr size_t kMaxBindings = 256;
inline constexpr size_t kMaxGrants = 16;

// `pattern` is a whole identity, or a prefix ending in "*" ("*" alone: anyone).
bool Matches(absl::string_view pattern, absl::string_view identity);

class Policy {
 public:
  // Nodes are spiffe://fuselink/node/{node} (peer), routers .../router/* (router,
  // viewer), engines .../engine/* (engine), viewers .../viewer/* (viewer).
  static Policy Default();
  // INVALID_ARGUMENT (BAD_POLICY) naming the first thing wrong.
  static absl::StatusOr<Policy> FromProto(const v1::AccessPolicy& proto);
  // A fuselink.v1.AccessPolicy in protobuf JSON.
  static absl::StatusOr<Policy> LoadFile(const std::string& path);

  // The union of the roles of every binding that matches.
  Roles RolesOf(absl::string_view identity) const;
  // The node a peer identity names, or nullopt when it is no peer identity.
  std::optional<std::string> NodeOf(absl::string_view identity) const;
  // The identity node `node` must prove.
  std::string IdentityOf(absl::string_view node) const;

 private:
  std::string peer_prefix_;  // the peer identity template around "{node}"
  std::string peer_suffix_;
  std::vector<std::pair<std::string, Roles>> bindings_;
};

// A caller, as the guard established it.
struct Caller {
  std::string identity;  // empty under open access
  Roles roles = 0;
  // Open access (--plaintext): every action is allowed and nothing is owned.
  bool open = false;

  bool Has(Roles any_of) const { return open || (roles & any_of) != 0; }
  static Caller Open() {
    Caller caller;
    caller.open = true;
    return caller;
  }
};

// Grants are identities, prefixes ending in "*", or "role:<role>". INVALID_ARGUMENT
// (BAD_GRANT) naming `field` when there are more than kMaxGrants or one is malformed.
absl::Status ValidateGrants(const std::vector<std::string>& grants,
                            absl::string_view field);
// True for the owner, and for a caller an entry of `grants` matches by identity or
// names one of its roles.
bool Granted(const Caller& caller, absl::string_view owner,
             const std::vector<std::string>& grants);

}  // namespace fuselink::security
