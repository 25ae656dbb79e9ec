// Linked (as an object, so that its initializer runs) into test binaries whose tests
// skip where their hardware is absent. Prints kAllSkippedMarker when every test
// skipped and none failed, so that ctest, keyed on it (SKIP_REGULAR_EXPRESSION),
// reports the binary as skipped rather than passed. GoogleTest's own summary cannot
// tell that apart from every test failing.
#include <cstdio>

#include "gtest/gtest.h"

namespace fuselink::testing {
namespace {

constexpr char kAllSkippedMarker[] = "FUSELINK: every test skipped";

class AllSkippedMarker final : public ::testing::EmptyTestEventListener {
 public:
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    if (unit.skipped_test_count() > 0 && unit.successful_test_count() == 0 &&
        unit.failed_test_count() == 0) {
      std::printf("%s\n", kAllSkippedMarker);
    }
  }
};

const bool kInstalled = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new AllSkippedMarker);
  return true;
}();

}  // namespace
}  // namespace fuselink::testing
