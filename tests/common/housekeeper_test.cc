// Housekeeper (agent/common/housekeeper.h): tasks run when due and again after the
// delay they return, RunSoon brings one forward, Stop ends a long wait at once, and a
// never-blocking housekeeper's thread refuses code that may block.
#include "agent/common/housekeeper.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/common/check.h"
#include "gtest/gtest.h"

namespace fuselink {
namespace {

// Generous: these bound waits on a loaded machine, they do not time anything.
constexpr absl::Duration kPatience = absl::Seconds(20);

bool WaitFor(const std::function<bool()>& done) {
  const absl::Time give_up = absl::Now() + kPatience;
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(HousekeeperTest, ATaskRunsAgainAfterTheDelayItReturns) {
  Housekeeper keeper("test", /*never_blocks=*/true);
  std::atomic<int> fast{0};
  std::atomic<int> slow{0};
  const Housekeeper::TaskId f = keeper.Add("fast", absl::ZeroDuration(), [&] {
    ++fast;
    return absl::Milliseconds(1);
  });
  keeper.Add("slow", absl::Hours(1), [&] {
    ++slow;
    return absl::Hours(1);
  });
  keeper.Start();
  ASSERT_TRUE(WaitFor([&] { return fast.load() >= 5; }));
  keeper.Stop();
  EXPECT_EQ(keeper.runs(f), static_cast<uint64_t>(fast.load()));
  EXPECT_EQ(slow.load(), 0) << "a task ran before it was due";
}

TEST(HousekeeperTest, RunSoonBringsATaskForward) {
  Housekeeper keeper("test", /*never_blocks=*/true);
  std::atomic<int> runs{0};
  const Housekeeper::TaskId id = keeper.Add("repair", absl::Hours(1), [&] {
    ++runs;
    return absl::Hours(1);
  });
  keeper.RunSoon(id);  // before Start: changes nothing
  keeper.Start();
  EXPECT_EQ(runs.load(), 0);
  keeper.RunSoon(id);
  ASSERT_TRUE(WaitFor([&] { return runs.load() == 1; }));
  keeper.RunSoon(id);
  ASSERT_TRUE(WaitFor([&] { return runs.load() == 2; }));
}

TEST(HousekeeperTest, RunSoonDuringARunRunsItOnceMore) {
  Housekeeper keeper("test", /*never_blocks=*/false);
  absl::Notification running;
  absl::Notification release;
  std::atomic<int> runs{0};
  const Housekeeper::TaskId id = keeper.Add("task", absl::ZeroDuration(), [&] {
    if (++runs == 1) {
      running.Notify();
      release.WaitForNotification();
    }
    return absl::Hours(1);
  });
  keeper.Start();
  running.WaitForNotification();
  keeper.RunSoon(id);  // while it runs
  release.Notify();
  ASSERT_TRUE(WaitFor([&] { return runs.load() == 2; }));
}

TEST(HousekeeperTest, StopEndsALongWaitAtOnce) {
  Housekeeper keeper("test", /*never_blocks=*/true);
  keeper.Add("idle", absl::Hours(1), [] { return absl::Hours(1); });
  keeper.Start();
  const absl::Time asked = absl::Now();
  keeper.Stop();
  // Not a timing claim: an hour's wait that Stop did not end would hang the test.
  EXPECT_LT(absl::Now() - asked, kPatience);
  keeper.Stop();  // idempotent
}

TEST(HousekeeperTest, ANeverBlockingHousekeeperRunsItsTasksInThatRole) {
  std::atomic<ThreadRole> seen{ThreadRole::kAny};
  absl::Notification ran;
  Housekeeper keeper("test", /*never_blocks=*/true);
  keeper.Add("look", absl::ZeroDuration(), [&] {
    seen = CurrentThreadRole();
    ran.Notify();
    return absl::Hours(1);
  });
  keeper.Start();
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(kPatience));
  EXPECT_EQ(seen.load(), ThreadRole::kHousekeeping);
#ifdef FUSELINK_DCHECK
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        SetThreadRole(ThreadRole::kHousekeeping);
        FL_MAY_BLOCK();
      },
      "code that may block runs on a thread that must not block");
#endif
}

}  // namespace
}  // namespace fuselink
