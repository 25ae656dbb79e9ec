#include "agent/security/policy.h"

#include <fstream>

#include "agent/common/status_macros.h"
#include "gtest/gtest.h"

namespace fuselink::security {
namespace {

TEST(Policy, DefaultBindsEachKindOfIdentityToItsRoles) {
  const Policy p = Policy::Default();
  EXPECT_EQ(p.RolesOf("spiffe://fuselink/node/a"), Bit(Role::kPeer));
  EXPECT_EQ(p.RolesOf("spiffe://fuselink/router/r"),
            Bit(Role::kRouter) | Bit(Role::kViewer));
  EXPECT_EQ(p.RolesOf("spiffe://fuselink/engine/e"), Bit(Role::kEngine));
  EXPECT_EQ(p.RolesOf("spiffe://fuselink/viewer/v"), Bit(Role::kViewer));
  EXPECT_EQ(p.RolesOf("spiffe://other/router/r"), 0);
  EXPECT_EQ(p.RolesOf(""), 0);
}

TEST(Policy, PeerIdentitiesNameTheirNode) {
  const Policy p = Policy::Default();
  EXPECT_EQ(p.NodeOf("spiffe://fuselink/node/node-a"), "node-a");
  EXPECT_EQ(p.NodeOf("spiffe://fuselink/node/"), std::nullopt);
  EXPECT_EQ(p.NodeOf("spiffe://fuselink/router/node-a"), std::nullopt);
  EXPECT_EQ(p.IdentityOf("node-b"), "spiffe://fuselink/node/node-b");
  v1::AccessPolicy proto;
  proto.set_peer_identity("spiffe://corp/ns/gpu/sa/{node}/agent");
  proto.add_bindings()->set_identity("spiffe://corp/*");
  proto.mutable_bindings(0)->add_roles("peer");
  absl::StatusOr<Policy> custom = Policy::FromProto(proto);
  ASSERT_TRUE(custom.ok()) << custom.status();
  EXPECT_EQ(custom->NodeOf("spiffe://corp/ns/gpu/sa/n7/agent"), "n7");
  EXPECT_EQ(custom->NodeOf("spiffe://corp/ns/gpu/sa/n7/agentx"), std::nullopt);
  EXPECT_EQ(custom->IdentityOf("n7"), "spiffe://corp/ns/gpu/sa/n7/agent");
}

TEST(Policy, BadPoliciesAreRefusedNamingWhatIsWrong) {
  auto bad = [](const v1::AccessPolicy& proto) {
    absl::StatusOr<Policy> p = Policy::FromProto(proto);
    return p.ok() ? "" : ReasonOf(p.status());
  };
  v1::AccessPolicy no_node;
  no_node.set_peer_identity("spiffe://fuselink/node/");
  EXPECT_EQ(bad(no_node), "BAD_POLICY");
  v1::AccessPolicy twice;
  twice.set_peer_identity("spiffe://{node}/{node}");
  EXPECT_EQ(bad(twice), "BAD_POLICY");
  v1::AccessPolicy unknown_role;
  unknown_role.add_bindings()->set_identity("x");
  unknown_role.mutable_bindings(0)->add_roles("admin");
  EXPECT_EQ(bad(unknown_role), "BAD_POLICY");
  v1::AccessPolicy no_roles;
  no_roles.add_bindings()->set_identity("x");
  EXPECT_EQ(bad(no_roles), "BAD_POLICY");
  v1::AccessPolicy spaces;
  spaces.add_bindings()->set_identity("a b");
  spaces.mutable_bindings(0)->add_roles("viewer");
  EXPECT_EQ(bad(spaces), "BAD_POLICY");
}

TEST(Policy, LoadsJsonAndRefusesUnknownFields) {
  const std::string path = ::testing::TempDir() + "/policy.json";
  std::ofstream(path)
      << R"({"bindings": [{"identity": "spiffe://x/*", "roles": ["router"]}]})";
  absl::StatusOr<Policy> p = Policy::LoadFile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->RolesOf("spiffe://x/r"), Bit(Role::kRouter));
  std::ofstream(path) << R"({"bindingz": []})";
  EXPECT_EQ(ReasonOf(Policy::LoadFile(path).status()), "BAD_POLICY");
  EXPECT_EQ(ReasonOf(Policy::LoadFile(path + ".missing").status()), "BAD_POLICY");
}

TEST(Grants, OwnerIdentitiesPrefixesAndRoles) {
  const Caller router{.identity = "spiffe://fuselink/router/r1",
                      .roles = Bit(Role::kRouter) | Bit(Role::kViewer)};
  const std::string owner = "spiffe://fuselink/engine/e1";
  EXPECT_TRUE(Granted(router, owner, {"role:router"}));
  EXPECT_FALSE(Granted(router, owner, {"role:engine"}));
  EXPECT_TRUE(Granted(router, owner, {"spiffe://fuselink/router/*"}));
  EXPECT_TRUE(Granted(router, owner, {"spiffe://fuselink/router/r1"}));
  EXPECT_FALSE(Granted(router, owner, {"spiffe://fuselink/router/r2"}));
  EXPECT_FALSE(Granted(router, owner, {}));
  EXPECT_TRUE(Granted(Caller{.identity = owner, .roles = 0, .open = false}, owner, {}));
  EXPECT_FALSE(Granted(Caller{}, "", {"*"}));  // nobody is no one's owner
  EXPECT_TRUE(Granted(Caller::Open(), owner, {}));
}

TEST(Grants, ValidatedAtRegistration) {
  EXPECT_TRUE(ValidateGrants({"role:router", "spiffe://x/*"}, "readers").ok());
  EXPECT_EQ(ReasonOf(ValidateGrants({"role:admin"}, "readers")), "BAD_GRANT");
  EXPECT_EQ(ReasonOf(ValidateGrants({""}, "writers")), "BAD_GRANT");
  EXPECT_EQ(ReasonOf(ValidateGrants({"a\nb"}, "writers")), "BAD_GRANT");
  EXPECT_EQ(ReasonOf(ValidateGrants(std::vector<std::string>(kMaxGrants + 1, "x"), "w")),
            "BAD_GRANT");
  EXPECT_EQ(ReasonOf(ValidateGrants({std::string(kMaxIdentityBytes + 1, 'x')}, "w")),
            "BAD_GRANT");
}

}  // namespace
}  // namespace fuselink::security
