// A target that stops answering, on real RDMA devices: its NIC keeps its QPs in RTS and
// acknowledges writes until the receives its poller posted are used up, then answers
// receiver-not-ready (RNR) for as long as the poller is stopped, as a frozen agent's
// would (SIGSTOP). The source's writes must still complete, each exactly once, with
// the reason FABRIC_ACK_TIMEOUT: by the default RNR retries, which are finite
// (RcParams::rnr_retry), or by the ack watchdog (VerbsFabricOptions::ack_timeout)
// where the RNR retries are infinite (rnr_retry 7).
// The fixture is in verbs_fabric_test_util.h.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/verbs/fabric.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"
#include "tests/rdma/verbs_fabric_test_util.h"

namespace fuselink::fabric {
namespace {

using testing::RandomBytes;
using testing::VerbsFabricTest;
using Clock = std::chrono::steady_clock;

// true: RNR retried forever by the NIC (rnr_retry 7), the watchdog ends it (500 ms);
// false: the default finite RNR retries end it, with the watchdog out of the way.
class VerbsStalledTargetTest : public VerbsFabricTest,
                               public ::testing::WithParamInterface<bool> {};

TEST_P(VerbsStalledTargetTest, WritesFailWithinTheBoundAndExactlyOnce) {
  const bool watchdog = GetParam();
  constexpr uint32_t kReceives = 4;  // b's receives per QP: RNR from the 6th write on
  FL_MAKE(
      1, 1, [](VerbsFabricOptions& b) { b.recv_depth_per_qp = kReceives; },
      [&](VerbsFabricOptions& a) {
        if (watchdog) {
          a.rc.rnr_retry = 7;
          a.ack_timeout = absl::Milliseconds(500);
        } else {
          a.ack_timeout = absl::Seconds(60);
        }
      });
  constexpr uint32_t kBytes = 4096;
  constexpr int kWrites = 12;
  std::vector<uint8_t> source = RandomBytes(kBytes, 5);
  std::vector<uint8_t> target(kWrites * kBytes, testing::kUntouched);
  const RegionKey source_key = Region(*a_, source);
  const WindowKey window =
      Window(Region(*b_, target), "a", {{0, uint64_t{kWrites} * kBytes}});
  ASSERT_NE(window, 0u);
  // b's poller stops inside its first arrival, as a frozen agent's would.
  absl::Notification thaw;
  b_events_.SetCheck([&](const Arrival&) {
    thaw.WaitForNotificationWithTimeout(testing::kWaitTimeout + absl::Seconds(30));
  });
  const auto started = Clock::now();
  for (int i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(Post(0, {.local_key = source_key,
                         .remote_key = window,
                         .remote_offset = uint64_t(i) * kBytes,
                         .bytes = kBytes,
                         .imm = 1,
                         .wr_id = uint64_t(i) + 1})
                    .ok());
  }
  int failed = 0;
  for (int i = 0; i < kWrites; ++i) {
    std::optional<Completion> c = CompletionOf(uint64_t(i) + 1);
    ASSERT_TRUE(c.has_value()) << "write " << i << " never completed";
    if (!c->status.ok()) {
      EXPECT_EQ(c->status.code(), absl::StatusCode::kUnavailable) << c->status;
      EXPECT_EQ(ReasonOf(c->status), "FABRIC_ACK_TIMEOUT") << c->status;
      if (!watchdog) {
        EXPECT_NE(c->status.message().find("receiver was not ready"), std::string::npos)
            << c->status;
      }
      ++failed;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  std::printf("bench: a stopped target, %s: %d of %d writes failed, the last in %.2f s\n",
              watchdog ? "RNR forever, 500 ms ack watchdog" : "the default RNR retries",
              failed, kWrites, seconds);
  thaw.Notify();
  // The check must not outlive `thaw`: b's poller delivers the receives it still holds
  // from here on. SetCheck waits for a check that is running to return.
  b_events_.SetCheck(nullptr);
  // The receives b had posted took writes; the rest could not land.
  EXPECT_GT(failed, 0);
  EXPECT_LE(failed, kWrites - static_cast<int>(kReceives));
  // One QP closed, by whichever bound the case leaves in place.
  EXPECT_EQ(a_->counters(0).ack_timeouts, 1u);
  // The finite retries end it well inside the watchdog (60 s) and a second.
  if (!watchdog) {
    EXPECT_LT(seconds, 1.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Bound, VerbsStalledTargetTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "AckWatchdog" : "RnrRetries";
                         });

}  // namespace
}  // namespace fuselink::fabric
