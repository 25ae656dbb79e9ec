#include "agent/security/guard.h"

#include <map>
#include <string>

#include "agent/common/status_macros.h"
#include "gtest/gtest.h"

namespace fuselink::security {
namespace {

TEST(Guard, IdentifiesByTheCertificatesSpiffeId) {
  Guard guard(Policy::Default(), false);
  absl::StatusOr<Caller> caller = guard.Identify(true, {"spiffe://fuselink/router/r"});
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->identity, "spiffe://fuselink/router/r");
  EXPECT_TRUE(caller->Has(Bit(Role::kRouter)));
  EXPECT_FALSE(caller->Has(Bit(Role::kEngine)));
  EXPECT_EQ(ReasonOf(guard.Identify(false, {}).status()), "NO_CLIENT_CERTIFICATE");
  EXPECT_TRUE(absl::IsUnauthenticated(guard.Identify(nullptr).status()));
  EXPECT_EQ(ReasonOf(guard.Identify(true, {}).status()), "NO_IDENTITY");
  EXPECT_EQ(ReasonOf(guard.Identify(true, {"a", "b"}).status()), "NO_IDENTITY");
}

TEST(Guard, RefusesWithReasonsAndCountsEach) {
  Guard guard(Policy::Default(), false);
  const Caller engine = guard.CallerOf("spiffe://fuselink/engine/e1");
  const Caller peer = guard.CallerOf("spiffe://fuselink/node/node-a");
  absl::Status s = guard.Require(engine, Bit(Role::kRouter), "move tensors");
  EXPECT_TRUE(absl::IsPermissionDenied(s));
  EXPECT_EQ(ReasonOf(s), "ROLE_REQUIRED");
  EXPECT_TRUE(guard.RequireNode(peer, "node-a").ok());
  EXPECT_EQ(ReasonOf(guard.RequireNode(peer, "node-b")), "NODE_MISMATCH");
  EXPECT_EQ(ReasonOf(guard.RequireNode(engine, "node-a")), "NODE_MISMATCH");
  EXPECT_EQ(ReasonOf(guard.RequireOwner(engine, "spiffe://fuselink/engine/e2", "kv")),
            "NOT_OWNER");
  EXPECT_EQ(
      ReasonOf(guard.RequireGrant(engine, "someone", {"role:router"}, "out of", "kv")),
      "TENSOR_ACCESS");
  std::map<std::string, uint64_t> counted;
  for (auto [reason, n] : guard.refusals()) counted[std::string(reason)] = n;
  EXPECT_EQ(counted["ROLE_REQUIRED"], 1);
  EXPECT_EQ(counted["NODE_MISMATCH"], 2);
  EXPECT_EQ(counted["NOT_OWNER"], 1);
  EXPECT_EQ(counted["TENSOR_ACCESS"], 1);
  EXPECT_EQ(counted["NO_CLIENT_CERTIFICATE"], 0);
}

TEST(Guard, OpenAccessAllowsEverythingAndOwnsNothing) {
  Guard guard(Policy::Default(), true);
  absl::StatusOr<Caller> caller = guard.Identify(nullptr);
  ASSERT_TRUE(caller.ok());
  EXPECT_TRUE(caller->open);
  EXPECT_TRUE(guard.Require(*caller, Bit(Role::kPeer), "x").ok());
  EXPECT_TRUE(guard.RequireNode(*caller, "any").ok());
  EXPECT_TRUE(guard.RequireOwner(*caller, "spiffe://x", "kv").ok());
}

}  // namespace
}  // namespace fuselink::security
