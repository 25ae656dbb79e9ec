// The scheduler's decisions on scripted NIC states: every rule of the FuseLink
// policy, and the two it is compared with; the foreign-traffic rule.
#include "agent/sched/scheduler.h"

#include <vector>

#include "agent/common/status_macros.h"
#include "agent/sched/foreign_rule.h"
#include "gtest/gtest.h"

namespace fuselink::sched {
namespace {

constexpr uint32_t kAllIdle = 0xF;
constexpr int kNics = 4;  // NIC k owned by GPU k

Scheduler Make(Policy policy, uint32_t direct_depth = 2, uint32_t borrow_depth = 1) {
  return Scheduler(policy, kNics, Limits{direct_depth, borrow_depth});
}

TEST(Scheduler, DirectNicFirst) {
  Scheduler s = Make(Policy::kFuselink);
  Choice c = s.Pick(0, kAllIdle);
  EXPECT_EQ(c.nic, 0);
  EXPECT_FALSE(c.borrowed);
}

TEST(Scheduler, BorrowsIdleNicsOnceTheDirectOneIsFull) {
  Scheduler s = Make(Policy::kFuselink, 2, 1);
  s.Pick(0, kAllIdle);
  s.Pick(0, kAllIdle);  // NIC 0 full (direct_depth 2)
  std::vector<int> lent;
  for (int i = 0; i < 3; ++i) {
    Choice c = s.Pick(0, kAllIdle);
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c.borrowed);
    lent.push_back(c.nic);
  }
  std::sort(lent.begin(), lent.end());
  EXPECT_EQ(lent, (std::vector<int>{1, 2, 3}));  // one each: borrow_depth 1
  EXPECT_FALSE(s.Pick(0, kAllIdle).ok());        // everything full: wait
  EXPECT_EQ(s.Stats(1).borrow_events, 1u);
}

// Several transfers of one GPU share its NIC's direct_depth. One that has no chunk
// there yet is not kept out by its siblings' refills: with nothing to borrow, its
// chunk goes over the depth; one with a chunk there waits, as before.
TEST(Scheduler, ATransferWithNothingOnItsOwnNicIsNotShutOutBySiblings) {
  Scheduler s = Make(Policy::kFuselink, 2, 1);
  constexpr uint32_t kNoneIdle = 0;
  constexpr uint32_t kMany = Scheduler::kManyChunks;
  ASSERT_EQ(s.Pick(0, kNoneIdle, ~0u, kMany, 0).nic, 0);  // a sibling fills NIC 0
  ASSERT_EQ(s.Pick(0, kNoneIdle, ~0u, kMany, 1).nic, 0);
  EXPECT_FALSE(s.Pick(0, kNoneIdle, ~0u, kMany, 2).ok());  // the sibling waits
  EXPECT_FALSE(s.Pick(0, kNoneIdle, ~0u, kMany).ok());     // so does one that did not say
  const Choice late = s.Pick(0, kNoneIdle, ~0u, kMany, 0);  // a transfer starting now
  EXPECT_EQ(late.nic, 0);
  EXPECT_FALSE(late.borrowed);
  EXPECT_EQ(s.Stats(0).in_flight, 3u);
  EXPECT_FALSE(s.Pick(0, kNoneIdle, ~0u, kMany, 1).ok());  // once it has one, it waits
  // With a NIC to borrow, the borrow comes first: the direct queue stays as deep.
  const Choice lent = s.Pick(0, kAllIdle, ~0u, kMany, 0);
  EXPECT_TRUE(lent.borrowed);
  EXPECT_EQ(s.Stats(0).in_flight, 3u);
}

// A transfer with few chunks left queues no more than its even share on its own NIC
// (never under borrow_depth) while it may borrow: its tail spreads over the lent NICs.
TEST(Scheduler, AShortTransferQueuesOnlyItsShareOnItsOwnNic) {
  auto direct_of = [](uint32_t remaining, uint32_t remote_idle) {
    Scheduler s = Make(Policy::kFuselink, 8, 2);
    int direct = 0;
    for (int i = 0; i < 16; ++i) {  // placed at once: nothing lands meanwhile
      const Choice c = s.Pick(0, remote_idle, ~0u, remaining);
      if (!c.ok()) break;
      direct += c.nic == 0;
    }
    return direct;
  };
  EXPECT_EQ(direct_of(16, kAllIdle), 4);  // 16 chunks over 4 NICs
  EXPECT_EQ(direct_of(12, kAllIdle), 3);
  EXPECT_EQ(direct_of(3, kAllIdle), 2);     // never under borrow_depth
  EXPECT_EQ(direct_of(1000, kAllIdle), 8);  // a long transfer keeps the deep queue
  EXPECT_EQ(direct_of(Scheduler::kManyChunks, kAllIdle), 8);
  EXPECT_EQ(direct_of(16, 0x1), 8);  // nothing to borrow: the direct NIC takes it all
  // The share counts only the NICs it may borrow now: 16 over NICs 0 and 2.
  EXPECT_EQ(direct_of(16, 0x5), 8);
}

TEST(Scheduler, NeverBorrowsABusyOwnersNic) {
  Scheduler s = Make(Policy::kFuselink, 1, 4);
  s.OwnerStarted(2);
  ASSERT_TRUE(s.Pick(0, kAllIdle).ok());  // fills NIC 0
  // NICs 1 and 3 take borrow_depth (4) chunks each; NIC 2, whose owner is busy, none.
  std::vector<int> per_nic(kNics, 0);
  for (int i = 0; i < 8; ++i) {
    Choice c = s.Pick(0, kAllIdle);
    ASSERT_TRUE(c.ok()) << "pick " << i;
    EXPECT_TRUE(c.borrowed);
    ++per_nic[c.nic];
  }
  EXPECT_EQ(per_nic, (std::vector<int>{0, 4, 0, 4}));
  EXPECT_FALSE(s.Pick(0, kAllIdle).ok());  // it waits rather than take NIC 2
}

TEST(Scheduler, HonoursTheReceiversCredits) {
  Scheduler s = Make(Policy::kFuselink, 1, 4);
  s.Pick(0, kAllIdle);
  const uint32_t only_nic3_idle_there = 1u << 3;
  for (int i = 0; i < 4; ++i) {
    Choice c = s.Pick(0, only_nic3_idle_there);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c.nic, 3);
  }
  EXPECT_FALSE(s.Pick(0, only_nic3_idle_there).ok());  // NIC 3's borrow bound
}

TEST(Scheduler, GiveBackBoundsTheOwnersWaitAndTimesIt) {
  // direct_depth above borrow_depth: a returning owner always finds room on its NIC.
  Scheduler s = Make(Policy::kFuselink, 3, 2);
  for (int i = 0; i < 3; ++i) s.Pick(0, kAllIdle);              // NIC 0 full
  const Choice a = s.Pick(0, 1u << 1), b = s.Pick(0, 1u << 1);  // two borrowed on NIC 1
  ASSERT_EQ(a.nic, 1);
  ASSERT_EQ(b.nic, 1);
  EXPECT_FALSE(s.Pick(0, 1u << 1).ok());  // NIC 1's borrow bound
  s.OwnerStarted(1);                      // the owner returns
  EXPECT_EQ(s.Stats(1).give_back_events, 1u);
  EXPECT_TRUE(s.Stats(1).owner_busy);
  // Its own chunk goes on its NIC at once, beside at most borrow_depth borrowed ones.
  const Choice owner = s.Pick(1, kAllIdle);
  EXPECT_EQ(owner.nic, 1);
  EXPECT_FALSE(owner.borrowed);
  // The give-back ends when the last borrowed chunk leaves, and is timed.
  EXPECT_EQ(s.Complete(a, 100), 0);
  EXPECT_GT(s.Complete(b, 100), 0);
  EXPECT_EQ(s.Stats(1).borrowed_in_flight, 0u);
  EXPECT_EQ(s.Stats(1).borrowed_bytes, 200u);
  // And no borrower goes back while the owner is busy.
  for (int i = 0; i < 8; ++i) EXPECT_FALSE(s.Pick(0, 1u << 1).ok());
}

TEST(Scheduler, OwnerIdleAgainOnlyAfterAQuietLook) {
  Scheduler s = Make(Policy::kFuselink);
  s.OwnerStarted(1);
  const Choice c = s.Pick(1, kAllIdle);
  s.OwnerStopped(1);
  s.Complete(c, 10);
  s.Refresh();  // activity since the last look: still busy
  EXPECT_TRUE(s.Stats(1).owner_busy);
  s.Refresh();  // a quiet look: idle
  EXPECT_FALSE(s.Stats(1).owner_busy);
  EXPECT_EQ(s.IdleMask(), kAllIdle);
}

TEST(Scheduler, AtMostOneStaleChoiceAfterTheOwnerReturns) {
  // A pick that raced the owner's return holds its reservation; Pick re-checks the
  // owner after reserving, so a pick that starts after OwnerStarted never lands there.
  Scheduler s = Make(Policy::kFuselink, 1, 8);
  s.Pick(0, kAllIdle);
  s.OwnerStarted(1);
  s.OwnerStarted(2);
  s.OwnerStarted(3);
  for (int i = 0; i < 16; ++i) EXPECT_FALSE(s.Pick(0, kAllIdle).ok());
}

TEST(Scheduler, FairBetweenBorrowers) {
  // Two borrowers (home NICs 0 and 1, both full) share NICs 2 and 3.
  Scheduler s = Make(Policy::kFuselink, 1, 2);
  s.OwnerStarted(0);
  s.OwnerStarted(1);
  s.Pick(0, kAllIdle);
  s.Pick(1, kAllIdle);
  int got0 = 0, got1 = 0;
  for (int i = 0; i < 4; ++i) {
    got0 += s.Pick(0, kAllIdle).ok();
    got1 += s.Pick(1, kAllIdle).ok();
  }
  EXPECT_EQ(got0 + got1, 4);  // 2 NICs x borrow_depth 2
  EXPECT_EQ(got0, 2);
  EXPECT_EQ(got1, 2);
}

TEST(Scheduler, StaticAndStripe) {
  Scheduler fixed = Make(Policy::kStatic);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(fixed.Pick(2, 0).nic, 2);  // no bound, no borrowing
  Scheduler stripe = Make(Policy::kStripe);
  std::vector<int> count(4);
  for (int i = 0; i < 8; ++i) {
    Choice c = stripe.Pick(0, 0);  // ignores owners and credits
    ++count[c.nic];
    EXPECT_EQ(c.borrowed, c.nic != 0);
  }
  EXPECT_EQ(count, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(ReasonOf(ParsePolicy("fastest").status()), "UNKNOWN_POLICY");
}

TEST(Scheduler, FailoverKeepsToUsableNics) {
  for (Policy policy : {Policy::kStatic, Policy::kStripe, Policy::kFuselink}) {
    Scheduler s = Make(policy, 2, 1);
    const uint32_t usable = 0b1010;  // NICs 0 and 2 failed for this transfer
    for (int i = 0; i < 6; ++i) {
      Choice c = s.Pick(0, kAllIdle, usable);
      ASSERT_TRUE(c.ok()) << PolicyName(policy);
      EXPECT_TRUE(c.nic == 1 || c.nic == 3) << PolicyName(policy) << " took " << c.nic;
      EXPECT_TRUE(c.borrowed);
      s.Complete(c, 0, /*failed=*/true);
    }
    EXPECT_FALSE(s.Pick(0, kAllIdle, 0).ok());  // nothing left
    EXPECT_EQ(s.Stats(1).failed_chunks + s.Stats(3).failed_chunks, 6u);
  }
}

TEST(Scheduler, ForeignBusyNicLendsNothingAndGivesBack) {
  Scheduler s = Make(Policy::kFuselink, 3, 2);
  for (int i = 0; i < 3; ++i) s.Pick(0, kAllIdle);  // NIC 0 full
  const Choice a = s.Pick(0, 1u << 1), b = s.Pick(0, 1u << 1);
  ASSERT_EQ(a.nic, 1);
  ASSERT_EQ(b.nic, 1);
  // Foreign traffic on NIC 1: a give-back begins, like an owner's return.
  s.SetForeignBusy(1u << 1);
  EXPECT_FALSE(s.Stats(1).owner_busy);  // the owner itself is idle
  EXPECT_EQ(s.Stats(1).give_back_events, 1u);
  EXPECT_EQ(s.IdleMask() >> 1 & 1, 0u);
  // The owner coming back during that give-back joins it: still one give-back.
  s.OwnerStarted(1);
  EXPECT_TRUE(s.Stats(1).owner_busy);
  EXPECT_EQ(s.Stats(1).give_back_events, 1u);
  s.OwnerStopped(1);
  // No new borrowed chunk goes there, even after both borrowed ones finished.
  EXPECT_EQ(s.Complete(a, 10), 0);
  EXPECT_GT(s.Complete(b, 10), 0);  // the give-back is timed
  for (int i = 0; i < 8; ++i) EXPECT_FALSE(s.Pick(0, 1u << 1).ok());
  // The owner's own chunks still go on its NIC.
  const Choice own = s.Pick(1, kAllIdle);
  EXPECT_EQ(own.nic, 1);
  EXPECT_FALSE(own.borrowed);
  s.Complete(own, 10);
  s.Refresh();
  s.Refresh();  // the owner's chunk is a look old: its owner is idle again
  // Foreign traffic gone: NIC 1 lends again.
  s.SetForeignBusy(0);
  const Choice again = s.Pick(0, 1u << 1);
  EXPECT_EQ(again.nic, 1);
  EXPECT_TRUE(again.borrowed);
}

TEST(Scheduler, ForeignBusyMaskKeepsOtherNicsLending) {
  Scheduler s = Make(Policy::kFuselink, 1, 4);
  s.SetForeignBusy(1u << 2 | 1u << 30);  // bits past the node's NICs are dropped
  EXPECT_EQ(s.IdleMask(), 0b1011u);
  EXPECT_EQ(s.Stats(2).give_back_events, 0u);  // nothing was lent there
  ASSERT_TRUE(s.Pick(0, kAllIdle).ok());
  std::vector<int> per_nic(kNics, 0);
  for (int i = 0; i < 8; ++i) {
    Choice c = s.Pick(0, kAllIdle);
    ASSERT_TRUE(c.ok()) << "pick " << i;
    ++per_nic[c.nic];
  }
  EXPECT_EQ(per_nic, (std::vector<int>{0, 4, 0, 4}));
}

TEST(Scheduler, StripeAndStaticIgnoreForeignTraffic) {
  Scheduler stripe = Make(Policy::kStripe);
  stripe.SetForeignBusy(kAllIdle);
  std::vector<int> count(4);
  for (int i = 0; i < 8; ++i) ++count[stripe.Pick(0, kAllIdle).nic];
  EXPECT_EQ(count, (std::vector<int>{2, 2, 2, 2}));
  Scheduler fixed = Make(Policy::kStatic);
  fixed.SetForeignBusy(kAllIdle);
  EXPECT_EQ(fixed.Pick(2, kAllIdle).nic, 2);
}

// Idle while demand: only samples in which a transfer waited count, and only on NICs
// with nothing in flight and no foreign traffic; a completion makes a NIC idle again.
TEST(Scheduler, CountsIdleTimeOnlyWhileATransferWaits) {
  Scheduler s = Make(Policy::kFuselink, 2, 1);
  const Choice on0 = s.Pick(0, kAllIdle);
  ASSERT_EQ(on0.nic, 0);
  s.SetForeignBusy(1u << 3);
  s.SampleIdle(1000, /*waited=*/false);  // nobody waited: nothing counts
  s.SampleIdle(-5, /*waited=*/true);     // a clock that went back counts nothing
  for (int k = 0; k < kNics; ++k) EXPECT_EQ(s.Stats(k).idle_while_demand_ns, 0u) << k;
  s.SampleIdle(1000, /*waited=*/true);
  EXPECT_EQ(s.Stats(0).idle_while_demand_ns, 0u);  // a chunk in flight
  EXPECT_EQ(s.Stats(1).idle_while_demand_ns, 1000u);
  EXPECT_EQ(s.Stats(2).idle_while_demand_ns, 1000u);
  EXPECT_EQ(s.Stats(3).idle_while_demand_ns, 0u);  // foreign traffic uses it
  s.Complete(on0, 1 << 20);
  s.SampleIdle(500, /*waited=*/true);
  EXPECT_EQ(s.Stats(0).idle_while_demand_ns, 500u);
  EXPECT_EQ(s.Stats(1).idle_while_demand_ns, 1500u);
}

TEST(ForeignRule, BusyAtOnceIdleOnlyAfterAQuietHold) {
  const ForeignRule rule{
      .busy_bytes_per_s = 1000, .release_fraction = 0.5, .hold = absl::Milliseconds(100)};
  ForeignState st;
  const absl::Duration t0 = absl::ZeroDuration();
  EXPECT_FALSE(ForeignStep(rule, 999, t0, st));
  EXPECT_TRUE(ForeignStep(rule, 1000, t0, st));  // at the threshold: busy at once
  // Between the release level and the threshold: stays busy, however long.
  EXPECT_TRUE(ForeignStep(rule, 600, t0 + absl::Seconds(5), st));
  // Quiet, but not long enough; a burst in the middle starts the hold again.
  EXPECT_TRUE(ForeignStep(rule, 100, t0 + absl::Milliseconds(5010), st));
  EXPECT_TRUE(ForeignStep(rule, 100, t0 + absl::Milliseconds(5090), st));
  EXPECT_TRUE(ForeignStep(rule, 700, t0 + absl::Milliseconds(5100), st));
  EXPECT_TRUE(ForeignStep(rule, 0, t0 + absl::Milliseconds(5150), st));
  EXPECT_TRUE(ForeignStep(rule, 0, t0 + absl::Milliseconds(5249), st));
  EXPECT_FALSE(ForeignStep(rule, 0, t0 + absl::Milliseconds(5250), st));
  // Idle: a rate under the threshold does not make it busy again.
  EXPECT_FALSE(ForeignStep(rule, 900, t0 + absl::Seconds(6), st));
}

TEST(ForeignRule, ZeroThresholdIsOff) {
  ForeignState st;
  EXPECT_FALSE(ForeignStep(ForeignRule{}, 1e12, absl::ZeroDuration(), st));
  EXPECT_FALSE(st.busy);
}

}  // namespace
}  // namespace fuselink::sched
