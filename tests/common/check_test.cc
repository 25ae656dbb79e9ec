// The invariant macros (agent/common/check.h), in the build they run in: a checking
// build (FUSELINK_DCHECK: the sanitized ones) aborts on FL_DCHECK, FL_EXPECT and
// FL_MAY_BLOCK; a release build compiles the first and the last out and counts the
// second. FL_CHECK aborts in both.
#include "agent/common/check.h"

#include <thread>

#include "gtest/gtest.h"

namespace fuselink {
namespace {

class CheckTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(CheckTest, ABrokenCheckAbortsNamingWhereAndWhat) {
  FL_CHECK(1 + 1 == 2, "arithmetic");  // holds: nothing happens
  EXPECT_DEATH(FL_CHECK(1 + 1 == 3, "two and one are three"),
               "invariant broken at .*check_test.cc:[0-9]+: two and one are three");
}

TEST_F(CheckTest, DebugChecksRunOnlyInCheckingBuilds) {
  int evaluated = 0;
  FL_DCHECK((++evaluated, true), "counts its evaluations");
#ifdef FUSELINK_DCHECK
  EXPECT_EQ(evaluated, 1);
  EXPECT_DEATH(FL_DCHECK(false, "checked here"), "invariant broken.*checked here");
#else
  EXPECT_EQ(evaluated, 0) << "a release build must not evaluate the condition";
  FL_DCHECK(false, "compiled out");
#endif
}

TEST_F(CheckTest, AMissedExpectationAbortsInCheckingBuildsAndIsCountedInRelease) {
#ifdef FUSELINK_DCHECK
  EXPECT_DEATH(FL_EXPECT(false, "expected"), "invariant broken.*expected");
#else
  const uint64_t before = InvariantFailures();
  FL_EXPECT(false, "expected");
  FL_EXPECT(true, "held");
  EXPECT_EQ(InvariantFailures(), before + 1);
#endif
}

TEST_F(CheckTest, CodeThatMayBlockIsCaughtOnAFabricThread) {
  EXPECT_EQ(CurrentThreadRole(), ThreadRole::kAny);
  FL_MAY_BLOCK();  // fine here
  std::thread([] {
    SetThreadRole(ThreadRole::kFabric);
    EXPECT_EQ(CurrentThreadRole(), ThreadRole::kFabric);
  }).join();
  EXPECT_EQ(CurrentThreadRole(), ThreadRole::kAny) << "a role is the thread's own";
#ifdef FUSELINK_DCHECK
  EXPECT_DEATH(
      {
        SetThreadRole(ThreadRole::kFabric);
        FL_MAY_BLOCK();
      },
      "code that may block runs on a thread that must not block");
#endif
}

}  // namespace
}  // namespace fuselink
