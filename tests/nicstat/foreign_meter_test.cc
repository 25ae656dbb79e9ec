// The foreign-bytes arithmetic on scripted counters: what it counts, what it must
// not (our own bytes, however late our count of them), and counters that go back.
#include "agent/nicstat/foreign_meter.h"

#include "gtest/gtest.h"

namespace fuselink::nicstat {
namespace {

TEST(ForeignMeter, FirstLookSetsTheBase) {
  ForeignMeter m;
  EXPECT_EQ(m.Update(1'000'000, 0, 0), 0u);  // the kernel's count before we started
  EXPECT_EQ(m.Update(1'000'500, 0, 0), 500u);
  EXPECT_EQ(m.total(), 500u);
}

TEST(ForeignMeter, OwnTrafficIsNotForeign) {
  ForeignMeter m;
  m.Update(0, 0, 0);
  // A chunk of 1000 on the wire: the kernel counts it first, we count it when it is
  // acknowledged; the slack (our bytes in flight) covers the gap.
  EXPECT_EQ(m.Update(400, 0, 1000), 0u);
  EXPECT_EQ(m.Update(1000, 0, 1000), 0u);
  EXPECT_EQ(m.Update(1000, 1000, 0), 0u);  // acknowledged
  // Steady streaming with the queue filling and draining: nothing counted.
  uint64_t kernel = 1000, own = 1000;
  for (int i = 0; i < 100; ++i) {
    const uint64_t queued = (i % 3) * 500;  // our bytes counted by the kernel, not us
    kernel += 1000;
    own = kernel - queued;
    EXPECT_EQ(m.Update(kernel, own, 2000), 0u) << "look " << i;
  }
  EXPECT_EQ(m.total(), 0u);
}

TEST(ForeignMeter, ADrainingQueueIsNotCountedTwice) {
  // The naive per-look difference would count the drain (our count catching up is
  // fine, but the kernel's count rising while ours already did is not foreign).
  ForeignMeter m;
  m.Update(0, 0, 0);
  EXPECT_EQ(m.Update(3000, 0, 3000), 0u);     // 3000 of ours on the wire, uncounted
  EXPECT_EQ(m.Update(3000, 3000, 0), 0u);     // acknowledged
  EXPECT_EQ(m.Update(6000, 3000, 3000), 0u);  // again
  EXPECT_EQ(m.total(), 0u);
}

TEST(ForeignMeter, ForeignBesideOwnIsCounted) {
  ForeignMeter m;
  m.Update(0, 0, 0);
  uint64_t kernel = 0, own = 0, foreign = 0;
  for (int i = 0; i < 50; ++i) {
    own += 1000;
    foreign += 700;
    kernel = own + foreign + 300;  // 300 of ours in flight
    m.Update(kernel, own, 300);
  }
  // All of it, less at most the slack.
  EXPECT_LE(m.total(), foreign);
  EXPECT_GE(m.total(), foreign - 300);
}

TEST(ForeignMeter, AnOverGenerousAllowanceDoesNotHideLaterForeignTraffic) {
  ForeignMeter m;
  m.Update(0, 0, 0);
  // Our count (with its allowance) runs 10% ahead of the kernel for a long time.
  uint64_t kernel = 0, own = 0;
  for (int i = 0; i < 1000; ++i) {
    kernel += 1000;
    own += 1100;
    EXPECT_EQ(m.Update(kernel, own, 0), 0u);
  }
  // Then foreign traffic alone: counted from its first byte, not after 100000.
  EXPECT_EQ(m.Update(kernel + 5000, own, 0), 5000u);
}

TEST(ForeignMeter, ACounterThatGoesBackStartsANewBase) {
  ForeignMeter m;
  m.Update(10'000, 0, 0);
  EXPECT_EQ(m.Update(12'000, 0, 0), 2000u);
  EXPECT_EQ(m.Update(100, 500, 0), 0u);  // reset: nothing counted, not negative
  EXPECT_EQ(m.resets(), 1u);
  EXPECT_EQ(m.Update(1100, 1000, 0), 500u);  // 1000 in, 500 of it ours
  EXPECT_EQ(m.total(), 2500u);
  // Wrapping 64-bit counters go back too: the same rule.
  ForeignMeter w;
  w.Update(UINT64_MAX - 10, 0, 0);
  EXPECT_EQ(w.Update(5, 0, 0), 0u);
  EXPECT_EQ(w.Update(105, 0, 0), 100u);
}

}  // namespace
}  // namespace fuselink::nicstat
