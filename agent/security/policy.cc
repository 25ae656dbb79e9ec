#include "agent/security/policy.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace fuselink::security {
namespace {

constexpr absl::string_view kNodeField = "{node}";
constexpr absl::string_view kRolePrefix = "role:";
constexpr absl::string_view kDefaultPeerIdentity = "spiffe://fuselink/node/{node}";

absl::Status BadPolicy(absl::string_view what) {
  return WithReason(absl::InvalidArgumentError(absl::StrCat("access policy: ", what)),
                    reasons::kBadPolicy);
}

// Printable ASCII without spaces: what a URI SAN can hold.
bool PrintableIdentity(absl::string_view s) {
  if (s.empty() || s.size() > kMaxIdentityBytes) return false;
  for (char c : s) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kRouter:
      return "router";
    case Role::kEngine:
      return "engine";
    case Role::kPeer:
      return "peer";
    case Role::kViewer:
      return "viewer";
  }
  return "unknown";
}

std::optional<Role> ParseRole(absl::string_view name) {
  for (Role role : {Role::kRouter, Role::kEngine, Role::kPeer, Role::kViewer}) {
    if (name == RoleName(role)) return role;
  }
  return std::nullopt;
}

bool Matches(absl::string_view pattern, absl::string_view identity) {
  if (absl::EndsWith(pattern, "*")) {
    return absl::StartsWith(identity, pattern.substr(0, pattern.size() - 1));
  }
  return pattern == identity;
}

Policy Policy::Default() {
  v1::AccessPolicy proto;
  proto.set_peer_identity(std::string(kDefaultPeerIdentity));
  auto bind = [&](const char* identity, std::initializer_list<const char*> roles) {
    v1::RoleBinding* b = proto.add_bindings();
    b->set_identity(identity);
    for (const char* r : roles) b->add_roles(r);
  };
  bind("spiffe://fuselink/node/*", {"peer"});
  bind("spiffe://fuselink/router/*", {"router", "viewer"});
  bind("spiffe://fuselink/engine/*", {"engine"});
  bind("spiffe://fuselink/viewer/*", {"viewer"});
  absl::StatusOr<Policy> policy = FromProto(proto);
  return *std::move(policy);  // the default above is valid; policy_test checks it
}

absl::StatusOr<Policy> Policy::FromProto(const v1::AccessPolicy& proto) {
  Policy out;
  const absl::string_view peer = proto.peer_identity().empty()
                                     ? kDefaultPeerIdentity
                                     : absl::string_view(proto.peer_identity());
  const size_t at = peer.find(kNodeField);
  if (!PrintableIdentity(peer) || at == absl::string_view::npos ||
      peer.find(kNodeField, at + 1) != absl::string_view::npos) {
    return BadPolicy(
        "peer_identity must hold \"{node}\" once, in at most 512 printable "
        "characters");
  }
  out.peer_prefix_ = std::string(peer.substr(0, at));
  out.peer_suffix_ = std::string(peer.substr(at + kNodeField.size()));
  if (proto.bindings_size() > static_cast<int>(kMaxBindings)) {
    return BadPolicy(absl::StrCat("more than ", kMaxBindings, " bindings"));
  }
  for (int i = 0; i < proto.bindings_size(); ++i) {
    const v1::RoleBinding& b = proto.bindings(i);
    if (!PrintableIdentity(b.identity())) {
      return BadPolicy(absl::StrCat("bindings[", i, "].identity must be 1 to ",
                                    kMaxIdentityBytes, " printable characters"));
    }
    Roles roles = 0;
    for (const std::string& name : b.roles()) {
      std::optional<Role> role = ParseRole(name);
      if (!role) {
        return BadPolicy(absl::StrCat("bindings[", i, "]: unknown role '",
                                      BoundedForMessage(name),
                                      "' (router, engine, peer, viewer)"));
      }
      roles |= Bit(*role);
    }
    if (roles == 0) return BadPolicy(absl::StrCat("bindings[", i, "] has no roles"));
    out.bindings_.emplace_back(b.identity(), roles);
  }
  return out;
}

absl::StatusOr<Policy> Policy::LoadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return BadPolicy(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  v1::AccessPolicy proto;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  if (auto s = google::protobuf::util::JsonStringToMessage(text.str(), &proto, options);
      !s.ok()) {
    return BadPolicy(absl::StrCat(path, ": ", s.message().as_string()));
  }
  return FromProto(proto);
}

Roles Policy::RolesOf(absl::string_view identity) const {
  Roles roles = 0;
  if (identity.empty()) return roles;
  for (const auto& [pattern, granted] : bindings_) {
    if (Matches(pattern, identity)) roles |= granted;
  }
  return roles;
}

std::optional<std::string> Policy::NodeOf(absl::string_view identity) const {
  if (identity.size() <= peer_prefix_.size() + peer_suffix_.size() ||
      !absl::StartsWith(identity, peer_prefix_) ||
      !absl::EndsWith(identity, peer_suffix_)) {
    return std::nullopt;
  }
  return std::string(identity.substr(
      peer_prefix_.size(), identity.size() - peer_prefix_.size() - peer_suffix_.size()));
}

std::string Policy::IdentityOf(absl::string_view node) const {
  return absl::StrCat(peer_prefix_, node, peer_suffix_);
}

absl::Status ValidateGrants(const std::vector<std::string>& grants,
                            absl::string_view field) {
  auto bad = [&](absl::string_view what) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(field, ": ", what)),
                      reasons::kBadGrant);
  };
  if (grants.size() > kMaxGrants) {
    return bad(absl::StrCat("at most ", kMaxGrants, " entries"));
  }
  for (const std::string& g : grants) {
    if (!PrintableIdentity(g)) {
      return bad(absl::StrCat("an entry must be 1 to ", kMaxIdentityBytes,
                              " printable characters"));
    }
    if (absl::StartsWith(g, kRolePrefix) && !ParseRole(g.substr(kRolePrefix.size()))) {
      return bad(absl::StrCat("unknown role in '", BoundedForMessage(g),
                              "' (router, engine, peer, viewer)"));
    }
  }
  return absl::OkStatus();
}

bool Granted(const Caller& caller, absl::string_view owner,
             const std::vector<std::string>& grants) {
  if (caller.open) return true;
  if (caller.identity.empty()) return false;
  if (caller.identity == owner) return true;
  for (const std::string& g : grants) {
    if (absl::StartsWith(g, kRolePrefix)) {
      std::optional<Role> role =
          ParseRole(absl::string_view(g).substr(kRolePrefix.size()));
      if (role && (caller.roles & Bit(*role)) != 0) return true;
    } else if (Matches(g, caller.identity)) {
      return true;
    }
  }
  return false;
}

}  // namespace fuselink::security
