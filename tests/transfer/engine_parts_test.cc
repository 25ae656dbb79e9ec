// The source engine's small parts, each on its own: failover classification and
// notices, the wait list's wakeups, the timer queue, the worker pools, the verdict
// wait's questions, the registry's request ids and forgetting, and the preparer's
// checks of a target's answer.
#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/admission.h"
#include "agent/transfer/failover.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/preparer.h"
#include "agent/transfer/timer_queue.h"
#include "agent/transfer/transfer_registry.h"
#include "agent/transfer/verdict_wait.h"
#include "agent/transfer/wait_list.h"
#include "agent/transfer/worker_pool.h"
#include "gtest/gtest.h"
#include "tests/transfer/fakes.h"

namespace fuselink::transfer {
namespace {

using testing::FakeFabric;

// --- failover.h ---

fabric::Completion Done(absl::Status status,
                        fabric::Refusal refusal = fabric::Refusal::kNone) {
  fabric::Completion c;
  c.status = std::move(status);
  c.refusal = refusal;
  return c;
}

TEST(Failover, ClassifiesCompletions) {
  EXPECT_EQ(ClassifyCompletion(Done(absl::OkStatus())), WriteOutcome::kLanded);
  EXPECT_EQ(ClassifyCompletion(Done(fabric::RefusalStatus(fabric::Refusal::kNoWindow),
                                    fabric::Refusal::kNoWindow)),
            WriteOutcome::kRefused);
  // A refusal told by its status alone is still one.
  EXPECT_EQ(
      ClassifyCompletion(Done(fabric::RefusalStatus(fabric::Refusal::kOutsideWindow))),
      WriteOutcome::kRefused);
  EXPECT_EQ(ClassifyCompletion(Done(absl::UnavailableError("lost"))),
            WriteOutcome::kNicFault);
  EXPECT_EQ(ClassifyCompletion(Done(absl::InternalError("device fault"))),
            WriteOutcome::kFailed);
}

TEST(Failover, ClassifiesPosts) {
  EXPECT_EQ(ClassifyPost(absl::OkStatus()), PostOutcome::kPosted);
  EXPECT_EQ(ClassifyPost(absl::ResourceExhaustedError("full")), PostOutcome::kQueueFull);
  EXPECT_EQ(ClassifyPost(absl::UnavailableError("down")), PostOutcome::kNicFault);
  EXPECT_EQ(ClassifyPost(absl::InvalidArgumentError("bad extent")), PostOutcome::kFailed);
}

TEST(Failover, ReachLosesNicsOneByOne) {
  NicReach reach(3);
  EXPECT_EQ(reach.mask(), 0b111u);
  EXPECT_EQ(reach.NextFrom(1), 1);
  EXPECT_TRUE(reach.Lose(1));
  EXPECT_EQ(reach.NextFrom(1), 2);
  EXPECT_TRUE(reach.Lose(2));
  EXPECT_EQ(reach.NextFrom(1), 0);
  EXPECT_FALSE(reach.Lose(0));
  EXPECT_EQ(reach.NextFrom(0), -1);
}

TEST(Failover, NoticeGoesOnTheFirstNicThatTakesIt) {
  FakeFabric fabric(3);
  NicReach reach(3);
  int nic = -1;
  absl::Status error;
  fabric.FailPosts(1, absl::UnavailableError("down"));
  fabric.FailPosts(2, absl::ResourceExhaustedError("full"), 1);
  EXPECT_EQ(PostNotice(fabric, 1, reach, 1, 42, 0, &nic, &error), PostOutcome::kPosted);
  EXPECT_EQ(nic, 0);  // 1 faulted (and left), 2 was full
  EXPECT_EQ(reach.mask(), 0b101u);
  fabric.FailPosts(-1, absl::ResourceExhaustedError("full"));
  EXPECT_EQ(PostNotice(fabric, 1, reach, 0, 42, 0, &nic, &error),
            PostOutcome::kQueueFull);
  EXPECT_EQ(reach.mask(), 0b101u);  // full is not a fault
  fabric.ClearPostFailures();
  fabric.FailPosts(-1, absl::UnavailableError("down"));
  EXPECT_EQ(PostNotice(fabric, 1, reach, 0, 42, 0, &nic, &error), PostOutcome::kNicFault);
  EXPECT_TRUE(reach.empty());
}

// --- wait_list.h ---

TEST(WaitList, AKickBetweenTryingAndListingIsNotLost) {
  WaitList<int> list;
  auto job = std::make_shared<int>(1);
  const auto ticket = list.ticket();       // the job tries, and finds no room...
  EXPECT_TRUE(list.Kick().empty());        // ...a completion frees room, nobody listed...
  EXPECT_FALSE(list.Enlist(job, ticket));  // ...so the job tries again, not sleeps
  EXPECT_TRUE(list.Enlist(job, list.ticket()));
  EXPECT_EQ(list.size(), 1u);
  std::vector<std::shared_ptr<int>> woken = list.Kick();
  ASSERT_EQ(woken.size(), 1u);
  EXPECT_EQ(woken[0], job);
  EXPECT_EQ(list.size(), 0u);
}

TEST(WaitList, ConcurrentKicksWakeEveryListedJob) {
  WaitList<int> list;
  std::atomic<int> woken{0};
  std::atomic<bool> stop{false};
  std::thread kicker([&] {
    while (!stop.load()) woken += static_cast<int>(list.Kick().size());
  });
  constexpr int kJobs = 2000;
  for (int i = 0; i < kJobs; ++i) {
    auto job = std::make_shared<int>(i);
    // Each job: try (take the ticket), fail, list itself; retry while kicks race.
    while (!list.Enlist(job, list.ticket())) {
    }
  }
  while (woken.load() < kJobs) std::this_thread::yield();
  stop.store(true);
  kicker.join();
  EXPECT_EQ(woken.load(), kJobs);
}

// --- timer_queue.h ---

TEST(TimerQueue, EarliestFirstAndOneTimerPerKey) {
  TimerQueue<int> timers;
  const absl::Time t0 = absl::FromUnixSeconds(100);
  auto a = std::make_shared<int>(1), b = std::make_shared<int>(2);
  timers.Set(1, a, t0 + absl::Seconds(5));
  timers.Set(2, b, t0 + absl::Seconds(3));
  timers.Set(1, a, t0 + absl::Seconds(1));  // moved earlier
  EXPECT_EQ(timers.size(), 2u);
  EXPECT_EQ(timers.next(), t0 + absl::Seconds(1));
  EXPECT_TRUE(timers.TakeDue(t0).empty());
  std::vector<std::shared_ptr<int>> due = timers.TakeDue(t0 + absl::Seconds(4));
  ASSERT_EQ(due.size(), 2u);
  EXPECT_EQ(*due[0], 1);
  EXPECT_EQ(*due[1], 2);
  timers.Set(2, b, t0);
  timers.Set(2, b, absl::InfiniteFuture());  // cleared
  EXPECT_EQ(timers.size(), 0u);
  EXPECT_EQ(timers.next(), absl::InfiniteFuture());
}

TEST(TimerQueue, WaitWakesForAnEarlierTimerAndOnStop) {
  TimerQueue<int> timers;
  std::thread waiter([&] {
    while (timers.Wait(absl::Now() + absl::Hours(1))) {
    }
  });
  timers.Set(1, std::make_shared<int>(1), absl::Now() + absl::Hours(2));
  timers.Stop();
  waiter.join();  // returns at once, not in an hour
}

// --- worker_pool.h ---

TEST(WorkerPool, RunsTasksAndStopsCleanly) {
  WorkerPool pool(2, "fl-test");
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) EXPECT_TRUE(pool.Post([&] { ++ran; }));
  pool.Stop(/*run_queued=*/true);
  EXPECT_EQ(ran.load(), 100);
  EXPECT_FALSE(pool.Post([&] { ++ran; }));  // refused once stopped
  pool.Stop(true);                          // idempotent
}

TEST(WorkerPool, StopDropsQueuedTasksWhenAsked) {
  WorkerPool pool(1, "fl-test");
  absl::Notification started, release;
  std::atomic<int> ran{0};
  pool.Post([&] {
    started.Notify();
    release.WaitForNotification();
  });
  started.WaitForNotification();
  for (int i = 0; i < 5; ++i) pool.Post([&] { ++ran; });
  std::thread stopper([&] { pool.Stop(/*run_queued=*/false); });
  while (pool.Post([] {})) {  // until Stop has begun: it takes nothing more
  }
  release.Notify();
  stopper.join();
  EXPECT_EQ(ran.load(), 0);
}

KeyedPoolOptions Lanes(int threads, int running_per_key, size_t pending_per_key,
                       size_t pending_total) {
  KeyedPoolOptions o;
  o.name = "calls to target";
  o.reason = reasons::kPrepareQueueFull;
  o.threads = threads;
  o.running_per_key = running_per_key;
  o.pending_per_key = pending_per_key;
  o.pending_total = pending_total;
  return o;
}

TEST(KeyedPool, AKeyThatHangsHoldsItsShareOfThreadsAndNoMore) {
  KeyedPool pool(Lanes(/*threads=*/2, /*running_per_key=*/1, 8, 64));
  absl::Notification began, release;
  std::atomic<int> slow_started{0};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pool.Post("slow",
                          [&] {
                            if (slow_started.fetch_add(1) == 0) began.Notify();
                            release.WaitForNotification();
                          })
                    .ok());
  }
  ASSERT_TRUE(began.WaitForNotificationWithTimeout(testing::kWaitTimeout));
  // Another key runs while "slow" holds a thread, again and again.
  for (int i = 0; i < 3; ++i) {
    absl::Notification ran;
    ASSERT_TRUE(pool.Post("fast", [&] { ran.Notify(); }).ok());
    EXPECT_TRUE(ran.WaitForNotificationWithTimeout(testing::kWaitTimeout));
  }
  EXPECT_EQ(slow_started.load(), 1);  // its others wait in its lane
  release.Notify();
  pool.Stop(/*run_queued=*/true);
  EXPECT_EQ(slow_started.load(), 3);
  EXPECT_EQ(pool.pending(), 0u);
}

TEST(KeyedPool, AKeysTasksStartInTheOrderPosted) {
  KeyedPool pool(Lanes(/*threads=*/4, /*running_per_key=*/1, 100, 100));
  absl::Mutex mu;
  std::vector<int> order;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(pool.Post("k",
                          [&, i] {
                            absl::MutexLock lock(&mu);
                            order.push_back(i);
                          })
                    .ok());
  }
  pool.Stop(/*run_queued=*/true);
  std::vector<int> expected(50);
  for (int i = 0; i < 50; ++i) expected[i] = i;
  EXPECT_EQ(order, expected);
}

TEST(KeyedPool, PostsPastABoundAreRefusedWithTheReasonAndCounted) {
  KeyedPool pool(Lanes(/*threads=*/1, /*running_per_key=*/1, /*pending_per_key=*/2,
                       /*pending_total=*/3));
  absl::Notification started, release;
  ASSERT_TRUE(pool.Post("a",
                        [&] {
                          started.Notify();
                          release.WaitForNotification();
                        })
                  .ok());
  started.WaitForNotification();
  ASSERT_TRUE(pool.Post("a", [] {}).ok());  // queued: two pending for "a"
  absl::Status per_key = pool.Post("a", [] {});
  EXPECT_EQ(per_key.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(per_key), "PREPARE_QUEUE_FULL");
  ASSERT_TRUE(pool.Post("b", [] {}).ok());  // three pending in all
  absl::Status total = pool.Post("c", [] {});
  EXPECT_EQ(total.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(total), "PREPARE_QUEUE_FULL");
  EXPECT_EQ(pool.refused(), 2u);
  release.Notify();
  pool.Stop(/*run_queued=*/true);
  EXPECT_EQ(pool.pending(), 0u);
  // Once stopped: UNAVAILABLE, not counted as a bound.
  absl::Status stopped = pool.Post("a", [] {});
  EXPECT_EQ(stopped.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(stopped), "SHUTTING_DOWN");
  EXPECT_EQ(pool.refused(), 2u);
}

TEST(KeyedPool, StopDropsQueuedTasksWhenAsked) {
  KeyedPool pool(Lanes(/*threads=*/1, /*running_per_key=*/1, 10, 10));
  absl::Notification started, release;
  std::atomic<int> ran{0};
  ASSERT_TRUE(pool.Post("a",
                        [&] {
                          started.Notify();
                          release.WaitForNotification();
                        })
                  .ok());
  started.WaitForNotification();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(pool.Post("b", [&] { ++ran; }).ok());
  std::thread stopper([&] { pool.Stop(/*run_queued=*/false); });
  // Until Stop has begun (posts past the bounds are refused meanwhile).
  while (pool.Post("c", [] {}).code() != absl::StatusCode::kUnavailable) {
  }
  release.Notify();
  stopper.join();
  EXPECT_EQ(ran.load(), 0);
}

// --- verdict_wait.h ---

const absl::Time kT0 = absl::FromUnixSeconds(1000);

VerdictWaitOptions WaitOptions() {
  VerdictWaitOptions o;
  o.notice_wait = absl::Seconds(1);
  o.query_every = absl::Seconds(2);
  o.max_query_errors = 3;
  o.give_up_after = absl::Seconds(10);
  return o;
}

TEST(VerdictWait, AsksAfterTheNoticeWaitAndTakesTheTargetsAnswer) {
  VerdictWait w(WaitOptions());
  w.Start(VerdictWait::Why::kCommitted, kT0, absl::InfiniteFuture(),
          NoVerdictStatus("b"));
  EXPECT_EQ(w.next(), kT0 + absl::Seconds(1));
  EXPECT_EQ(w.OnTimer(kT0), VerdictWait::Step::kNone);
  EXPECT_EQ(w.OnTimer(kT0 + absl::Seconds(1)), VerdictWait::Step::kAsk);
  EXPECT_EQ(w.next(), absl::InfiniteFuture());  // a question is out
  VerdictWait::Answer a = w.OnReply(std::optional<absl::Status>(absl::DataLossError("x")),
                                    kT0 + absl::Seconds(1));
  EXPECT_TRUE(a.done);
  EXPECT_TRUE(a.from_target);
  EXPECT_EQ(a.status.code(), absl::StatusCode::kDataLoss);
}

TEST(VerdictWait, OpenTransferIsAskedAgainUntilItGivesUp) {
  VerdictWait w(WaitOptions());
  w.Start(VerdictWait::Why::kCommitted, kT0, absl::InfiniteFuture(),
          NoVerdictStatus("b"));
  absl::Time t = kT0;
  int asked = 0;
  for (;;) {
    t = w.next();
    const VerdictWait::Step step = w.OnTimer(t);
    if (step == VerdictWait::Step::kGiveUp) break;
    ASSERT_EQ(step, VerdictWait::Step::kAsk);
    ++asked;
    EXPECT_FALSE(w.OnReply(std::optional<absl::Status>(), t).done);
  }
  EXPECT_EQ(t, kT0 + absl::Seconds(10));
  EXPECT_EQ(asked, 5);  // at 1, 3, 5, 7, 9 s
  EXPECT_EQ(ReasonOf(w.fallback()), "NO_VERDICT");
}

TEST(VerdictWait, TheDeadlineShortensTheWaitButOneQuestionIsAsked) {
  VerdictWait w(WaitOptions());
  w.Start(VerdictWait::Why::kCommitted, kT0, kT0 + absl::Milliseconds(10),
          NoVerdictStatus("b"));
  EXPECT_EQ(w.OnTimer(w.next()), VerdictWait::Step::kAsk);
  VerdictWait::Answer a =
      w.OnReply(std::optional<absl::Status>(), kT0 + absl::Seconds(1));
  EXPECT_TRUE(a.done);
  EXPECT_FALSE(a.from_target);
  EXPECT_EQ(ReasonOf(a.status), "NO_VERDICT");
}

TEST(VerdictWait, FailedQuestionsAreRetriedAFewTimes) {
  VerdictWait w(WaitOptions());
  w.Start(VerdictWait::Why::kCommitted, kT0, absl::InfiniteFuture(),
          NoVerdictStatus("b"));
  for (int i = 0; i < 3; ++i) {
    const absl::Time t = w.next();
    ASSERT_EQ(w.OnTimer(t), VerdictWait::Step::kAsk);
    VerdictWait::Answer a = w.OnReply(absl::NotFoundError("unknown"), t);
    EXPECT_EQ(a.done, i == 2);
  }
}

TEST(VerdictWait, RefusalTheTargetHasNotDecidedEndsWithTheRefusal) {
  VerdictWait w(WaitOptions());
  const absl::Status refusal = fabric::RefusalStatus(fabric::Refusal::kNoWindow);
  w.Start(VerdictWait::Why::kRefused, kT0, absl::InfiniteFuture(), refusal);
  ASSERT_EQ(w.OnTimer(w.next()), VerdictWait::Step::kAsk);
  VerdictWait::Answer a =
      w.OnReply(std::optional<absl::Status>(), kT0 + absl::Seconds(1));
  EXPECT_TRUE(a.done);
  EXPECT_FALSE(a.from_target);
  EXPECT_EQ(a.status, refusal);
}

// --- transfer_registry.h ---

class RegistryTest : public ::testing::Test {
 protected:
  RegistryTest()
      : fabric_(2), registry_(&fabric_), scheduler_(sched::Policy::kStatic, 2, {}) {
    ctx_.fabric = &fabric_;
    ctx_.scheduler = &scheduler_;
    ctx_.lanes = fabric_.nic_count();
  }
  void SetUp() override {
    ASSERT_TRUE(testing::RegisterHostTensor(registry_, "s", {1, 1, 4096, 0, 0}).ok());
  }
  absl::StatusOr<std::shared_ptr<Job>> Admit(TransferRegistry& r, const std::string& rid,
                                             const std::string& fp, bool* fresh,
                                             const std::string& requester = "") {
    return r.Admit(
        TransferRegistry::RequestKey(requester, rid), fp,
        [&](uint32_t serial, uint64_t number) {
          v1::TransferRequest request = testing::MakeRequest(rid, "s", {0}, "d", {0});
          auto t = std::make_shared<Transfer>(absl::StrCat("t", number), request, fp,
                                              std::vector<std::string>{},
                                              absl::InfiniteFuture());
          return std::make_shared<Job>(serial, t, *registry_.Acquire("s"), 0, &ctx_,
                                       requester);
        },
        fresh, requester);
  }
  FakeFabric fabric_;
  memory::Registry registry_;
  sched::Scheduler scheduler_;
  JobContext ctx_;
};

TEST_F(RegistryTest, RequestIdsNameOneTransferUntilFreed) {
  TransferRegistry r(RegistryOptions{.max_active = 2});
  bool fresh = false;
  auto a = Admit(r, "r", "fp", &fresh);
  ASSERT_TRUE(a.ok() && fresh);
  auto same = Admit(r, "r", "fp", &fresh);
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(fresh);
  EXPECT_EQ(*same, *a);
  EXPECT_EQ(ReasonOf(Admit(r, "r", "other", &fresh).status()), "REQUEST_ID_REUSED");
  ASSERT_TRUE(Admit(r, "q", "fp", &fresh).ok());
  EXPECT_EQ(ReasonOf(Admit(r, "p", "fp", &fresh).status()), "TOO_MANY_TRANSFERS");
  r.Finished(*a, /*free_request_id=*/true, kT0);
  EXPECT_EQ(r.active(), 1u);
  auto again = Admit(r, "r", "other", &fresh);  // a new attempt, any content
  ASSERT_TRUE(again.ok() && fresh);
  EXPECT_NE((*again)->serial(), (*a)->serial());
  EXPECT_EQ(*r.Find((*a)->transfer()->id(), ""), *a);  // still there by its id
  EXPECT_EQ(*r.Find("", TransferRegistry::RequestKey("", "r")), *again);
  EXPECT_TRUE(r.Close());
  EXPECT_FALSE(r.Close());
  EXPECT_EQ(ReasonOf(Admit(r, "z", "fp", &fresh).status()), "SHUTTING_DOWN");
}

TEST_F(RegistryTest, EachRequesterHoldsItsShareOfTransfers) {
  TransferRegistry r(RegistryOptions{.max_active = 4, .max_active_per_requester = 2});
  bool fresh = false;
  auto a = Admit(r, "a", "fp", &fresh, "r1");
  ASSERT_TRUE(a.ok() && fresh);
  ASSERT_TRUE(Admit(r, "b", "fp", &fresh, "r1").ok());
  absl::StatusOr<std::shared_ptr<Job>> over = Admit(r, "c", "fp", &fresh, "r1");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(over.status()), "TRANSFER_SHARE");
  EXPECT_EQ(r.share_refusals(), 1u);
  // The same request again is its transfer, not a new one: no share is spent.
  auto same = Admit(r, "a", "fp", &fresh, "r1");
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(fresh);
  // Another requester has its own share, up to the bound on all.
  ASSERT_TRUE(Admit(r, "c", "fp", &fresh, "r2").ok());
  ASSERT_TRUE(Admit(r, "d", "fp", &fresh, "r2").ok());
  EXPECT_EQ(ReasonOf(Admit(r, "e", "fp", &fresh, "r3").status()), "TOO_MANY_TRANSFERS");
  // An end gives the share back.
  r.Finished(*a, /*free_request_id=*/true, kT0);
  EXPECT_TRUE(Admit(r, "c", "fp", &fresh, "r1").ok());
  EXPECT_EQ(r.share_refusals(), 1u);
}

TEST_F(RegistryTest, ForgetsOldestFirstPastTheCapAndTheKeepingTime) {
  TransferRegistry r(RegistryOptions{
      .max_active = 10, .max_finished_kept = 2, .finished_kept_for = absl::Minutes(1)});
  std::vector<std::shared_ptr<Job>> jobs;
  bool fresh;
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(*Admit(r, absl::StrCat("r", i), "fp", &fresh));
    r.Finished(jobs.back(), false, kT0 + absl::Seconds(i));
  }
  r.Collect(kT0 + absl::Seconds(3));
  EXPECT_EQ(r.kept(), 2u);
  EXPECT_FALSE(r.Find(jobs[0]->transfer()->id(), "").ok());
  EXPECT_TRUE(r.Find("", TransferRegistry::RequestKey("", "r1")).ok());
  r.Collect(kT0 + absl::Seconds(61));
  EXPECT_EQ(r.kept(), 1u);
  r.Collect(kT0 + absl::Seconds(62));
  EXPECT_EQ(r.kept(), 0u);
}

TEST_F(RegistryTest, VerdictsFindTheLiveJobOfTheirSlot) {
  TransferRegistry r(RegistryOptions{});
  bool fresh;
  auto a = *Admit(r, "a", "fp", &fresh);
  auto b = *Admit(r, "b", "fp", &fresh);
  r.Accepted(a, "node-b", SlotId{5, 0x1234}.Pack());
  r.Accepted(b, "node-b", SlotId{5, 0x1235}.Pack());  // the slot reused meanwhile
  EXPECT_EQ(r.FindByVerdict("node-b", DecodeVerdict(EncodeVerdict(SlotId{5, 0x1234}, 0))),
            a);
  EXPECT_EQ(r.FindByVerdict("node-b", DecodeVerdict(EncodeVerdict(SlotId{5, 0x1235}, 0))),
            b);
  EXPECT_EQ(r.FindByVerdict("node-c", DecodeVerdict(EncodeVerdict(SlotId{5, 0x1234}, 0))),
            nullptr);
  r.Finished(a, false, kT0);
  EXPECT_EQ(r.FindByVerdict("node-b", DecodeVerdict(EncodeVerdict(SlotId{5, 0x1234}, 0))),
            nullptr);
  EXPECT_EQ(r.FindLive(a->serial()), nullptr);
  EXPECT_EQ(r.FindLive(b->serial()), b);
}

// A target that restarted draws a new incarnation and hands out its slots from the
// start: the verdict of a transfer it accepted anew names the slot and generation of
// one its previous incarnation accepted. That notice ends the new transfer only; the
// old one hears nothing more by notice (it asks QueryVerdict), and a notice of the
// old incarnation that comes late names nothing.
TEST_F(RegistryTest, VerdictsOfARestartedTargetNameOnlyItsOwnTransfers) {
  TransferRegistry r(RegistryOptions{});
  bool fresh;
  auto old_job = *Admit(r, "old", "fp", &fresh);
  auto new_job = *Admit(r, "new", "fp", &fresh);
  const SlotId slot{0, 0};  // the first slot of each incarnation
  const VerdictNotice notice = DecodeVerdict(EncodeVerdict(slot, 0));
  r.Accepted(old_job, "node-b", slot.Pack(), /*incarnation=*/0x1111);
  EXPECT_EQ(r.FindByVerdict("node-b", notice), old_job);
  r.Accepted(new_job, "node-b", slot.Pack(), /*incarnation=*/0x2222);
  EXPECT_EQ(r.FindByVerdict("node-b", notice), new_job);
  r.Finished(new_job, false, kT0);
  EXPECT_EQ(r.FindByVerdict("node-b", notice), nullptr);  // stray, not the old job's
  EXPECT_EQ(r.FindLive(old_job->serial()), old_job);
  // An accept that the new incarnation makes for a job that ended meanwhile still
  // tells the node's incarnation.
  auto third = *Admit(r, "third", "fp", &fresh);
  r.Finished(third, false, kT0);
  r.Accepted(third, "node-b", SlotId{1, 0}.Pack(), /*incarnation=*/0x3333);
  EXPECT_EQ(r.FindByVerdict("node-b", notice), nullptr);
}

// --- admission.h, preparer.h ---

TEST(Admission, RequestIdsAndDeadlines) {
  EXPECT_EQ(ReasonOf(CheckRequestId("")), "BAD_REQUEST_ID");
  EXPECT_EQ(ReasonOf(CheckRequestId(std::string(129, 'r'))), "BAD_REQUEST_ID");
  EXPECT_TRUE(CheckRequestId(std::string(128, 'r')).ok());
  v1::TransferRequest request = testing::MakeRequest("r", "s", {0}, "d", {0});
  EXPECT_EQ(RequestDeadline(request), absl::InfiniteFuture());
  request.mutable_deadline()->set_seconds(100);
  request.mutable_deadline()->set_nanos(5);
  EXPECT_EQ(RequestDeadline(request), absl::FromUnixNanos(100'000'000'005));
  // The deadline is not part of what makes two requests the same.
  v1::TransferRequest retry = request;
  retry.mutable_deadline()->set_seconds(200);
  EXPECT_EQ(Fingerprint(request), Fingerprint(retry));
  retry.mutable_target()->add_block_ids(1);
  EXPECT_NE(Fingerprint(request), Fingerprint(retry));
}

TEST(Admission, NodesAreCheckedAndQuotedShort) {
  testing::FakePeerLink peers;
  v1::TransferRequest request = testing::MakeRequest("r", "s", {0}, "d", {0});
  EXPECT_TRUE(CheckNodes(request, "node-a", peers).ok());
  request.mutable_source()->set_node(std::string(500, 'x'));
  absl::Status s = CheckNodes(request, "node-a", peers);
  EXPECT_EQ(ReasonOf(s), "UNKNOWN_NODE");
  EXPECT_EQ(s.message().find(std::string(65, 'x')), absl::string_view::npos);
  request.mutable_source()->set_node("node-b");
  EXPECT_EQ(ReasonOf(CheckNodes(request, "node-a", peers)), "SOURCE_NOT_LOCAL");
  request = testing::MakeRequest("r", "s", {0}, "d", {0});
  request.mutable_target()->set_node("node-a");
  EXPECT_EQ(ReasonOf(CheckNodes(request, "node-a", peers)), "LOCAL_TARGET");
  EXPECT_TRUE(CheckNodes(request, "node-a", peers, /*in_node=*/true).ok());
  request = testing::MakeRequest("r", "s", {0, 4}, "s", {3, 0});
  request.mutable_target()->set_node("node-a");
  EXPECT_EQ(ReasonOf(CheckNodes(request, "node-a", peers, true)), "SAME_BLOCKS");
  request.mutable_target()->set_tensor("d");
  EXPECT_TRUE(CheckNodes(request, "node-a", peers, true).ok());
  request = testing::MakeRequest("r", "s", {0, 1}, "d", {0});
  EXPECT_EQ(ReasonOf(CheckNodes(request, "node-a", peers)), "BLOCK_COUNT_MISMATCH");
}

TEST(Preparer, TheTargetsAnswerMustHoldTheRequest) {
  absl::StatusOr<memory::Layout> layout =
      memory::NormalizeLayout({2, 4, 4096, 0, 0}, 1 << 20);
  ASSERT_TRUE(layout.ok());
  v1::TransferRequest request = testing::MakeRequest("r", "s", {0, 1}, "d", {2, 3});
  Prepared ok = testing::MakePrepared(*layout);
  absl::StatusOr<std::vector<Extent>> plan = PlanTransfer(request, *layout, ok);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->size(), 2u);  // one run of two blocks per layer
  Prepared small = ok;
  small.layout.blocks_per_layer = 3;  // cannot hold block 3
  EXPECT_EQ(ReasonOf(PlanTransfer(request, *layout, small).status()), "TARGET_PROTOCOL");
  Prepared other_size = ok;
  other_size.layout.block_bytes = 8192;
  EXPECT_EQ(ReasonOf(PlanTransfer(request, *layout, other_size).status()),
            "TARGET_PROTOCOL");
  request.mutable_layers()->set_begin(1);
  request.mutable_layers()->set_end(3);
  EXPECT_EQ(ReasonOf(PlanTransfer(request, *layout, ok).status()), "TARGET_PROTOCOL");
  // A region the request writes needs a window from the target.
  request.clear_layers();
  Prepared no_window = ok;
  no_window.windows = {0};
  EXPECT_EQ(ReasonOf(PlanTransfer(request, *layout, no_window).status()),
            "TARGET_PROTOCOL");
  no_window.windows = {};
  EXPECT_EQ(ReasonOf(PlanTransfer(request, *layout, no_window).status()),
            "TARGET_PROTOCOL");
}

TEST(Preparer, APlanIsBoundedWhateverTheTargetAccepted) {
  // 16 parts a block on the source, in 16 regions so that no run joins another, and
  // a target that accepted 2^17 blocks of 4096 layers: refused before it is planned.
  memory::Layout source(memory::kMaxLayers, 1u << 17, 0, 0, 0, 16);
  for (uint32_t layer = 0; layer < memory::kMaxLayers; ++layer) {
    for (uint32_t p = 0; p < 16; ++p)
      source.parts.push_back({p, layer * 16ull, 1ull << 20, 16});
  }
  absl::StatusOr<memory::Layout> target =
      memory::NormalizeLayout({memory::kMaxLayers, 1u << 17, 256, 0, 0}, UINT64_MAX);
  ASSERT_TRUE(target.ok()) << target.status();
  std::vector<uint32_t> ids(1u << 17);
  for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
  v1::TransferRequest request = testing::MakeRequest("r", "s", ids, "d", ids);
  Prepared accepted = testing::MakePrepared(*target);
  source.block_bytes = 256;
  EXPECT_EQ(ReasonOf(PlanTransfer(request, source, accepted).status()), "TOO_FRAGMENTED");
}

}  // namespace
}  // namespace fuselink::transfer
