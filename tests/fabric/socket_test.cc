// The stall bound both fabrics read their frames with (RecvAllUnlessStalled,
// socket.h), over a socketpair: idle before a frame is no stall, a frame stopped
// midway is, within 1x to 1.25x the bound (plus the scheduler's slack), and bytes that
// keep coming or a shutdown end the wait as they should.
#include "agent/fabric/socket.h"

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <thread>

#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "agent/common/unique_fd.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"

namespace fuselink::fabric {
namespace {

constexpr int kStallMs = 300;
// What a loaded test machine may add to a wake.
constexpr absl::Duration kSlack = absl::Seconds(2);

struct Pair {
  UniqueFd reader;
  UniqueFd writer;
};

// A connected pair whose reader ticks as the fabrics' sockets do.
Pair MakePair() {
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  Pair pair{UniqueFd(fds[0]), UniqueFd(fds[1])};
  EXPECT_TRUE(SetReceiveTimeout(pair.reader.get(), TickMs(kStallMs, kStallTicks)).ok());
  return pair;
}

TEST(RecvAllUnlessStalled, IdleBeforeAFrameIsNoStall) {
  Pair pair = MakePair();
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(3 * kStallMs));
    std::array<uint8_t, 64> frame{};
    frame.fill(7);
    EXPECT_TRUE(testing::SendRaw(pair.writer.get(), frame.data(), frame.size()).ok());
  });
  std::array<uint8_t, 64> frame{};
  absl::Status received = RecvAllUnlessStalled(pair.reader.get(), frame.data(),
                                               frame.size(), kStallMs, /*begun=*/false);
  late.join();
  EXPECT_TRUE(received.ok()) << received;
  EXPECT_EQ(frame[63], 7);
}

TEST(RecvAllUnlessStalled, AFrameStoppedMidwayStallsWithinTheBound) {
  Pair pair = MakePair();
  std::array<uint8_t, 64> frame{};
  ASSERT_TRUE(testing::SendRaw(pair.writer.get(), frame.data(), 20).ok());
  const absl::Time started = absl::Now();
  absl::Status received = RecvAllUnlessStalled(pair.reader.get(), frame.data(),
                                               frame.size(), kStallMs, /*begun=*/false);
  const absl::Duration took = absl::Now() - started;
  std::printf(
      "bench: a frame stopped after 20 of 64 bytes closed after %.0f ms "
      "(bound %d ms)\n",
      absl::ToDoubleMilliseconds(took), kStallMs);
  EXPECT_EQ(received.code(), absl::StatusCode::kDeadlineExceeded) << received;
  EXPECT_EQ(ReasonOf(received), reasons::kFabricStall) << received;
  EXPECT_NE(received.message().find("20 of 64"), std::string::npos) << received;
  EXPECT_GE(took, absl::Milliseconds(kStallMs) - absl::Milliseconds(TickMs(kStallMs, 4)));
  EXPECT_LE(took, absl::Milliseconds(kStallMs * 5 / 4) + kSlack);
}

TEST(RecvAllUnlessStalled, ABegunPartWithNoByteStalls) {
  Pair pair = MakePair();
  std::array<uint8_t, 24> records{};
  const absl::Time started = absl::Now();
  absl::Status received = RecvAllUnlessStalled(pair.reader.get(), records.data(),
                                               records.size(), kStallMs, /*begun=*/true);
  const absl::Duration took = absl::Now() - started;
  EXPECT_EQ(ReasonOf(received), reasons::kFabricStall) << received;
  EXPECT_GE(took, absl::Milliseconds(kStallMs));
  EXPECT_LE(took, absl::Milliseconds(kStallMs * 5 / 4) + kSlack);
}

TEST(RecvAllUnlessStalled, BytesThatKeepComingAreNoStall) {
  Pair pair = MakePair();
  constexpr int kPieces = 8;  // one every half bound: 4 bounds in all
  std::thread trickle([&] {
    for (int i = 0; i < kPieces; ++i) {
      uint8_t byte = static_cast<uint8_t>(i);
      EXPECT_TRUE(testing::SendRaw(pair.writer.get(), &byte, 1).ok());
      absl::SleepFor(absl::Milliseconds(kStallMs / 2));
    }
  });
  std::array<uint8_t, kPieces> frame{};
  absl::Status received = RecvAllUnlessStalled(pair.reader.get(), frame.data(),
                                               frame.size(), kStallMs, /*begun=*/false);
  trickle.join();
  EXPECT_TRUE(received.ok()) << received;
  EXPECT_EQ(frame[kPieces - 1], kPieces - 1);
}

TEST(RecvAllUnlessStalled, AShutdownEndsAnIdleWaitAtOnce) {
  Pair pair = MakePair();
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    shutdown(pair.reader.get(), SHUT_RDWR);
  });
  std::array<uint8_t, 64> frame{};
  absl::Status received = RecvAllUnlessStalled(pair.reader.get(), frame.data(),
                                               frame.size(), kStallMs, /*begun=*/false);
  closer.join();
  EXPECT_EQ(received.code(), absl::StatusCode::kUnavailable) << received;
}

}  // namespace
}  // namespace fuselink::fabric
