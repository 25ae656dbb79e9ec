// What a thread writes before absl::Notification::Notify is ordered before what a
// waiter reads once its wait returns, also as ThreadSanitizer sees it: Debian's abseil
// is built without TSan, and a wait that finds the notice already given returns
// without taking the Mutex, so only tests/sanitizers/absl_mutex_annotations.cc makes
// that order visible. The TSan stage of scripts/test.sh is where this test can fail
// (a data race report); in other builds it checks the values only.
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace fuselink {
namespace {

// Each wait is entered well after the notice: the path that returns without the Mutex.
TEST(NotificationOrder, WritesBeforeNotifyAreSeenAfterEveryWait) {
  for (int kind = 0; kind < 3; ++kind) {
    int written = 0;  // plain memory, ordered only by the notification
    absl::Notification done;
    std::thread notifier([&] {
      written = 42 + kind;
      done.Notify();
    });
    absl::SleepFor(absl::Milliseconds(20));
    bool notified = true;
    switch (kind) {
      case 0:
        done.WaitForNotification();
        break;
      case 1:
        notified = done.WaitForNotificationWithTimeout(absl::Seconds(10));
        break;
      default:
        notified = done.WaitForNotificationWithDeadline(absl::Now() + absl::Seconds(10));
    }
    EXPECT_TRUE(notified) << kind;
    EXPECT_EQ(written, 42 + kind);
    notifier.join();
  }
}

TEST(NotificationOrder, WritesBeforeNotifyAreSeenOnceHasBeenNotified) {
  int written = 0;
  absl::Notification done;
  std::thread notifier([&] {
    written = 7;
    done.Notify();
  });
  while (!done.HasBeenNotified()) std::this_thread::yield();
  EXPECT_EQ(written, 7);
  notifier.join();
}

}  // namespace
}  // namespace fuselink
