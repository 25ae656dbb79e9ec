// The engine whole, with a fake fabric and a fake target: admission and request ids,
// the prepare threads, verdict routing, the wakeups of jobs that wait, the timers,
// cancel, deadlines, AbortTensor, and shutdown. Time is the test's clock; the engine's
// own threads are waited for on conditions, never on sleeps.
#include "agent/transfer/engine.h"

#include <atomic>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/topo/topology.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/verdict.h"
#include "agent/transfer/wr_id.h"
#include "gtest/gtest.h"
#include "tests/transfer/fakes.h"

namespace fuselink::transfer {
namespace {

using testing::FakeFabric;
using testing::FakePeerLink;
using testing::FakeRelayPool;
using testing::kWaitTimeout;
using testing::Posted;

const memory::Layout kLayout{2, 8, 8192, 0, 0};

fabric::Completion Landed(uint64_t wr_id) {
  fabric::Completion c;
  c.wr_id = wr_id;
  return c;
}

class Observer : public EngineObserver {
 public:
  void OnTransferFinished(State state, absl::Duration, uint64_t) override {
    absl::MutexLock lock(&mu_);
    states_.push_back(state);
  }
  void OnGiveBack(int, absl::Duration) override {}
  bool WaitFinished(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]()
                      ABSL_NO_THREAD_SAFETY_ANALYSIS { return states_.size() >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kWaitTimeout);
  }
  std::vector<State> states() const {
    absl::MutexLock lock(&mu_);
    return states_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<State> states_ ABSL_GUARDED_BY(mu_);
};

class EngineTest : public ::testing::Test {
 protected:
  explicit EngineTest(sched::Policy policy = sched::Policy::kStatic,
                      sched::Limits limits = {})
      : fabric_(2),
        registry_(&fabric_),
        scheduler_(policy, 2, limits),
        topology_(topo::EmulatedTopology(2, 0, 1'000'000'000)) {}

  void SetUp() override {
    absl::StatusOr<memory::TensorInfo> info =
        testing::RegisterHostTensor(registry_, "src", kLayout);
    ASSERT_TRUE(info.ok()) << info.status();
    layout_ = info->layout;
    peers_.set_prepared(testing::MakePrepared(layout_));
  }
  void TearDown() override {
    if (engine_ != nullptr) {
      engine_->Shutdown();
      fabric_.FlushAll();
    }
  }

  EngineOptions Options() {
    EngineOptions o;
    o.node = "node-a";
    o.chunk_bytes = 4096;
    o.window_chunks = 4;
    o.housekeeping_thread = false;
    o.clock = [this] { return now(); };
    o.verdict.notice_wait = absl::Seconds(1);
    o.verdict.query_every = absl::Seconds(1);
    o.verdict.give_up_after = absl::Seconds(3);
    return o;
  }
  void Make(EngineOptions o) {
    engine_ = std::make_unique<Engine>(o, topology_, &registry_, &fabric_, &peers_,
                                       &scheduler_, gpu_relay_, &observer_);
    fabric_.set_on_completion(
        [this](const fabric::Completion& c) { engine_->OnCompletion(c); });
  }
  void Make() { Make(Options()); }

  absl::Time now() const { return absl::FromUnixNanos(now_ns_.load()); }
  void Advance(absl::Duration d) { now_ns_ += absl::ToInt64Nanoseconds(d); }

  absl::StatusOr<std::shared_ptr<Transfer>> Submit(const std::string& rid,
                                                   std::vector<uint32_t> blocks = {0}) {
    return engine_->Submit(testing::MakeRequest(rid, "src", blocks, "dst", blocks),
                           absl::InfiniteFuture());
  }
  // Submits and waits until its first window is on the fabric.
  std::shared_ptr<Transfer> Start(const std::string& rid,
                                  std::vector<uint32_t> blocks = {0}) {
    const size_t before = fabric_.pending_count();
    absl::StatusOr<std::shared_ptr<Transfer>> t = Submit(rid, blocks);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return nullptr;
    EXPECT_TRUE(fabric_.WaitForPending(before + 4));
    return *t;
  }
  void Verdict(uint32_t slot_index, Verdict v) {
    engine_->OnVerdict("node-b",
                       EncodeVerdict(SlotId{slot_index, 300}, static_cast<uint8_t>(v)));
  }
  int Posts(ImmOp op, int nic = -1) const {
    int n = 0;
    for (const Posted& p : fabric_.history()) {
      n += ImmOpOf(p.op.imm) == op && (nic < 0 || p.nic == nic);
    }
    return n;
  }
  static std::pair<absl::StatusCode, std::string> End(const Transfer& t) {
    const v1::TransferStatus s = t.Status();
    return {static_cast<absl::StatusCode>(s.failure().code()), s.failure().reason()};
  }

  FakeFabric fabric_;
  memory::Registry registry_;
  sched::Scheduler scheduler_;
  topo::Topology topology_;
  FakePeerLink peers_;
  Observer observer_;
  relay::Pool* gpu_relay_ = nullptr;
  std::atomic<int64_t> now_ns_{absl::ToUnixNanos(absl::FromUnixSeconds(2'000'000))};
  memory::Layout layout_;
  std::unique_ptr<Engine> engine_;
};

using EngineDeathTest = EngineTest;

// A window past kMaxWindowChunks was once clamped into range in silence; an engine
// given one now stops the caller that skipped Validate, naming the field.
TEST_F(EngineDeathTest, OptionsOutOfRangeStopTheCaller) {
  EngineOptions o = Options();
  o.window_chunks = kMaxWindowChunks + 1;
  EXPECT_DEATH(Make(o), "window_chunks must be 1 to 1024, not 1025");
}

TEST_F(EngineTest, CompletesOnTheTargetsVerdictNotOnTheCommit) {
  Make();
  std::shared_ptr<Transfer> t = Start("r1");
  EXPECT_EQ(fabric_.CompleteAll(), 5u);  // four chunks and the commit
  EXPECT_FALSE(IsTerminal(t->state()));
  EXPECT_EQ(engine_->active(), 1u);
  Verdict(5, Verdict::kCompleted);
  EXPECT_EQ(t->state(), State::kCompleted);
  EXPECT_EQ(observer_.states(), std::vector<State>{State::kCompleted});
  EXPECT_EQ(engine_->active(), 0u);
}

TEST_F(EngineTest, TheSourceTensorIsFreeWhenTheStreamHearsTheEnd) {
  Make();
  std::shared_ptr<Transfer> t = Start("r1");
  // A caller that unregisters the tensor as soon as its stream ends must succeed. The
  // sink finishes each write at once, so that it ends on the engine's own thread.
  struct Sink : EventSink {
    void SendEvent(const v1::TransferEvent*) override {
      transfer->OnWriteDone(sub, true);
    }
    void End(const absl::Status&) override { unregistered = registry->Unregister("src"); }
    Transfer* transfer = nullptr;
    Transfer::Subscription* sub = nullptr;
    memory::Registry* registry = nullptr;
    absl::Status unregistered = absl::UnknownError("not ended");
  } sink;
  sink.transfer = t.get();
  sink.registry = &registry_;
  t->Subscribe(&sink, &sink.sub);
  fabric_.CompleteAll();
  Verdict(5, Verdict::kCompleted);
  EXPECT_TRUE(sink.unregistered.ok()) << sink.unregistered;
  t->Unsubscribe(sink.sub);
}

TEST_F(EngineTest, RefusalEndsThatTransferAloneAndLeavesTheNic) {
  Make();
  std::shared_ptr<Transfer> a = Start("a", {0});  // slot 5
  std::vector<Posted> a_writes = fabric_.Take();
  std::shared_ptr<Transfer> b = Start("b", {1});  // slot 6
  fabric_.Refuse(a_writes[0], fabric::Refusal::kNoWindow);
  for (size_t i = 1; i < a_writes.size(); ++i) fabric_.Complete(a_writes[i]);
  fabric_.CompleteAll();  // b's chunks and commit, all on NIC 0
  Verdict(6, Verdict::kCompleted);
  EXPECT_EQ(b->state(), State::kCompleted);
  EXPECT_EQ(Posts(ImmOp::kData, 1), 0);  // nothing failed over
  EXPECT_EQ(scheduler_.Stats(0).failed_chunks, 0u);
  EXPECT_FALSE(IsTerminal(a->state()));  // the target decides a
  Verdict(5, Verdict::kSourceIdle);
  EXPECT_EQ(End(*a),
            std::make_pair(absl::StatusCode::kUnavailable, std::string("SOURCE_IDLE")));
}

TEST_F(EngineTest, RefusalWithoutVerdictEndsWithTheTargetsAnswer) {
  Make();
  std::shared_ptr<Transfer> t = Start("r1");
  std::vector<Posted> writes = fabric_.Take();
  fabric_.Refuse(writes[0], fabric::Refusal::kNoWindow);
  for (size_t i = 1; i < writes.size(); ++i) fabric_.Complete(writes[i]);
  peers_.AddReply(std::optional<absl::Status>(
      WithReason(absl::FailedPreconditionError("lender exited"), reasons::kOwnerExited)));
  engine_->Tick(now());
  EXPECT_EQ(peers_.queries(), 0);  // the notice may still come
  Advance(absl::Seconds(1));
  engine_->Tick(now());
  ASSERT_TRUE(observer_.WaitFinished(1));
  EXPECT_EQ(peers_.queries(), 1);
  EXPECT_EQ(End(*t), std::make_pair(absl::StatusCode::kFailedPrecondition,
                                    std::string("OWNER_EXITED")));
}

TEST_F(EngineTest, NoVerdictAndNoAnswerIsNoVerdict) {
  EngineOptions o = Options();
  o.verdict.max_query_errors = 1;
  Make(o);
  std::shared_ptr<Transfer> t = Start("r1");
  fabric_.CompleteAll();
  Advance(absl::Seconds(1));
  engine_->Tick(now());  // asks; the target knows nothing of it
  ASSERT_TRUE(observer_.WaitFinished(1));
  EXPECT_EQ(End(*t),
            std::make_pair(absl::StatusCode::kUnavailable, std::string("NO_VERDICT")));
  EXPECT_EQ(Posts(ImmOp::kAbort), 1);
}

TEST_F(EngineTest, TransportFaultMovesTheChunkToAnotherNic) {
  Make();
  std::shared_ptr<Transfer> t = Start("r1");
  std::vector<Posted> writes = fabric_.Take();
  fabric_.Complete(writes[2], absl::UnavailableError("connection lost"));
  for (size_t i : {0, 1, 3}) fabric_.Complete(writes[i]);
  fabric_.CompleteAll();
  Verdict(5, Verdict::kCompleted);
  EXPECT_EQ(t->state(), State::kCompleted);
  EXPECT_EQ(Posts(ImmOp::kData, 1), 1);
  EXPECT_EQ(t->Status().progress().bytes_done(), 2 * 8192u);
}

// How a write fails when its connection saw no ACK for the fabric's whole bound.
absl::Status NoAck() {
  return WithReason(absl::UnavailableError("connection lost: no ACK for 1000 ms"),
                    reasons::kFabricAckTimeout);
}

bool WaitForState(const Transfer& t, State want) {
  const absl::Time give_up = absl::Now() + kWaitTimeout;
  while (t.state() != want) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// A write no ACK came back for: the target is asked whether it still answers, and
// when its agent is silent too the transfer ends PEER_LOST without trying the write
// on the next NIC (where a stopped target would cost another whole bound).
TEST_F(EngineTest, ATargetSilentOnItsNicsAndItsAgentEndsTheTransferAfterOneBound) {
  Make();
  std::shared_ptr<Transfer> t = Start("r1");
  peers_.AddReply(absl::DeadlineExceededError("Deadline Exceeded"));
  std::vector<Posted> writes = fabric_.Take();
  fabric_.Complete(writes[0], NoAck());
  ASSERT_TRUE(peers_.WaitForQueries(1));
  ASSERT_TRUE(WaitForState(*t, State::kStopping));  // decided; three writes still out
  for (size_t i : {1, 2, 3}) fabric_.Complete(writes[i], NoAck());
  EXPECT_EQ(End(*t),
            std::make_pair(absl::StatusCode::kUnavailable, std::string("PEER_LOST")));
  EXPECT_EQ(Posts(ImmOp::kData), 4) << "the unacknowledged write went out again";
  EXPECT_TRUE(fabric_.disconnects().empty());
}

// The same write, and the target's agent answers: a NIC's fault, not the target's.
// The write goes again on the other NIC and the transfer completes.
TEST_F(EngineTest, ATargetWhoseAgentAnswersGetsTheWriteOnAnotherNic) {
  Make();
  std::shared_ptr<Transfer> t = Start("r1");
  peers_.AddReply(std::optional<absl::Status>{});  // open: it is there
  std::vector<Posted> writes = fabric_.Take();
  const int silent_nic = writes[2].nic;
  fabric_.Complete(writes[2], NoAck());
  ASSERT_TRUE(peers_.WaitForQueries(1));
  for (size_t i : {0, 1, 3}) fabric_.Complete(writes[i]);
  ASSERT_TRUE(fabric_.WaitForPending(1)) << "the write did not go again";
  fabric_.CompleteAll();
  Verdict(5, Verdict::kCompleted);
  EXPECT_EQ(t->state(), State::kCompleted);
  EXPECT_EQ(Posts(ImmOp::kData), 5);  // the four, and the one again
  EXPECT_EQ(Posts(ImmOp::kData, 1 - silent_nic), 1);
}

TEST_F(EngineTest, AJobWaitingForRoomIsWokenByKick) {
  Make();
  fabric_.FailPosts(-1, absl::ResourceExhaustedError("queue full"), 1);
  ASSERT_TRUE(Submit("r1").ok());
  ASSERT_TRUE(peers_.WaitForPrepares(1));
  // Its one post met a full queue: nothing of it is in flight to wake it.
  while (fabric_.refused_posts() == 0) std::this_thread::yield();
  engine_->Kick();
  EXPECT_TRUE(fabric_.WaitForPending(4));
}

TEST_F(EngineTest, AJobWaitingForRoomIsWokenByAnotherTransfersCompletion) {
  Make();
  std::shared_ptr<Transfer> a = Start("a", {0});
  fabric_.FailPosts(-1, absl::ResourceExhaustedError("queue full"), 1);
  ASSERT_TRUE(Submit("b", {1}).ok());
  while (fabric_.refused_posts() == 0) std::this_thread::yield();
  std::vector<Posted> a_writes = fabric_.Take();
  fabric_.Complete(a_writes[0]);  // frees a place in the queue: b goes
  EXPECT_TRUE(fabric_.WaitForPending(4));
}

TEST_F(EngineTest, AJobWaitingForRoomIsWokenByIdleNics) {
  Make();
  fabric_.FailPosts(-1, absl::ResourceExhaustedError("queue full"), 1);
  ASSERT_TRUE(Submit("r1").ok());
  while (fabric_.refused_posts() == 0) std::this_thread::yield();
  engine_->OnIdleNics(1, 0b11);
  EXPECT_TRUE(fabric_.WaitForPending(4));
}

TEST_F(EngineTest, AJobWaitingForRoomIsWokenByItsBackstopTimer) {
  Make();
  fabric_.FailPosts(-1, absl::ResourceExhaustedError("queue full"), 1);
  ASSERT_TRUE(Submit("r1").ok());
  while (fabric_.refused_posts() == 0) std::this_thread::yield();
  // Whatever else happens, nothing else will: the job's own timer tries again.
  const absl::Time give_up = absl::Now() + kWaitTimeout;
  while (fabric_.pending_count() < 4 && absl::Now() < give_up) {
    Advance(absl::Milliseconds(20));
    engine_->Tick(now());
  }
  EXPECT_EQ(fabric_.pending_count(), 4u);
}

TEST_F(EngineTest, CancelStopsItAndTellsTheTarget) {
  Make();
  std::shared_ptr<Transfer> t = Start("r1", {0, 1});
  EXPECT_TRUE(engine_->Cancel(t).ok());
  fabric_.CompleteAll();
  EXPECT_EQ(t->state(), State::kCancelled);
  EXPECT_EQ(Posts(ImmOp::kAbort), 1);
  absl::Status again = engine_->Cancel(t);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(again), "TRANSFER_FINISHED");
}

TEST_F(EngineTest, DeadlineAlreadyReachedIsRefusedAtOnce) {
  Make();
  v1::TransferRequest late = testing::MakeRequest("late", "src", {0}, "dst", {0});
  late.mutable_deadline()->set_seconds(absl::ToUnixSeconds(now()) - 1);
  absl::StatusOr<std::shared_ptr<Transfer>> t =
      engine_->Submit(late, absl::InfiniteFuture());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ReasonOf(t.status()), "DEADLINE");
  // A deadline of exactly now is as late.
  t = engine_->Submit(testing::MakeRequest("now", "src", {0}, "dst", {0}), now());
  EXPECT_EQ(ReasonOf(t.status()), "DEADLINE");
  EXPECT_TRUE(peers_.specs().empty());
}

TEST_F(EngineTest, DeadlineThatPassesMidTransfer) {
  Make();
  absl::StatusOr<std::shared_ptr<Transfer>> t = engine_->Submit(
      testing::MakeRequest("r1", "src", {0, 1}, "dst", {0, 1}), now() + absl::Seconds(2));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(fabric_.WaitForPending(4));
  Advance(absl::Seconds(2));
  engine_->Tick(now());
  fabric_.CompleteAll();
  EXPECT_EQ(End(**t),
            std::make_pair(absl::StatusCode::kDeadlineExceeded, std::string("DEADLINE")));
}

// A decided transfer whose writes never come back (a target that stopped) closes the
// connections to its target once they outlive the drain bound; the fabric then fails
// them, and the transfer ends with its own reason.
TEST_F(EngineTest, WritesThatOutliveTheDrainBoundCloseTheConnectionsToTheTarget) {
  EngineOptions o = Options();
  o.drain_bound = absl::Seconds(5);
  Make(o);
  absl::StatusOr<std::shared_ptr<Transfer>> t = engine_->Submit(
      testing::MakeRequest("r1", "src", {0, 1}, "dst", {0, 1}), now() + absl::Seconds(2));
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(fabric_.WaitForPending(4));
  const fabric::PeerId target = fabric_.pending()[0].peer;
  Advance(absl::Seconds(2));
  engine_->Tick(now());
  EXPECT_EQ((*t)->state(), State::kStopping);  // decided; its writes are still out
  Advance(absl::Milliseconds(4900));
  engine_->Tick(now());
  EXPECT_TRUE(fabric_.disconnects().empty());
  EXPECT_EQ(engine_->forced_drains(), 0u);

  Advance(absl::Milliseconds(200));
  engine_->Tick(now());
  EXPECT_EQ(fabric_.disconnects(), std::vector<fabric::PeerId>{target});
  EXPECT_EQ(engine_->forced_drains(), 1u);
  EXPECT_EQ((*t)->state(), State::kStopping);  // until the fabric fails the writes
  fabric_.FlushAll();
  EXPECT_EQ(End(**t),
            std::make_pair(absl::StatusCode::kDeadlineExceeded, std::string("DEADLINE")));
  EXPECT_TRUE(registry_.Unregister("src").ok()) << "the source tensor is let go of";
  Advance(absl::Seconds(60));
  engine_->Tick(now());
  EXPECT_EQ(fabric_.disconnects().size(), 1u);  // once
}

TEST_F(EngineTest, WritesThatComeBackInTimeCloseNothing) {
  EngineOptions o = Options();
  o.drain_bound = absl::Seconds(5);
  Make(o);
  std::shared_ptr<Transfer> t = Start("r1", {0, 1});
  ASSERT_TRUE(engine_->Cancel(t).ok());
  Advance(absl::Seconds(4));
  engine_->Tick(now());
  fabric_.CompleteAll();
  EXPECT_EQ(t->state(), State::kCancelled);
  Advance(absl::Seconds(60));
  engine_->Tick(now());
  EXPECT_TRUE(fabric_.disconnects().empty());
  EXPECT_EQ(engine_->forced_drains(), 0u);
}

TEST_F(EngineTest, AbortTensorStopsTheTransfersThatReadIt) {
  Make();
  std::shared_ptr<Transfer> t = Start("r1", {0, 1});
  absl::StatusOr<memory::TensorLease> lease = registry_.Acquire("src");
  ASSERT_TRUE(lease.ok());
  engine_->AbortTensor(lease->id(), WithReason(absl::FailedPreconditionError("exited"),
                                               reasons::kOwnerExited));
  fabric_.CompleteAll();
  EXPECT_EQ(End(*t), std::make_pair(absl::StatusCode::kFailedPrecondition,
                                    std::string("OWNER_EXITED")));
}

TEST_F(EngineTest, RetryableFailureFreesTheRequestId) {
  Make();
  std::shared_ptr<Transfer> first = Start("r1");
  fabric_.FailPosts(-1, absl::UnavailableError("not connected"));
  for (const Posted& p : fabric_.Take()) {
    fabric_.Complete(p, absl::UnavailableError("connection lost"));
  }
  ASSERT_EQ(End(*first),
            std::make_pair(absl::StatusCode::kUnavailable, std::string("PEER_LOST")));
  fabric_.ClearPostFailures();
  std::shared_ptr<Transfer> second = Start("r1");  // the same request: a new attempt
  ASSERT_NE(second, nullptr);
  EXPECT_NE(second->id(), first->id());
  // The failed attempt is still there by its own id.
  absl::StatusOr<std::shared_ptr<Transfer>> found = engine_->Find(first->id(), "");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, first);
}

TEST_F(EngineTest, OtherFailuresKeepTheRequestId) {
  Make();
  std::shared_ptr<Transfer> first = Start("r1");
  fabric_.CompleteAll();
  Verdict(5, Verdict::kIncompleteCommit);
  ASSERT_EQ(End(*first).second, "INCOMPLETE_COMMIT");
  absl::StatusOr<std::shared_ptr<Transfer>> same = Submit("r1");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, first);  // the same content gets the same transfer
  absl::StatusOr<std::shared_ptr<Transfer>> other = Submit("r1", {3});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ReasonOf(other.status()), "REQUEST_ID_REUSED");
}

TEST_F(EngineTest, RequestTheTargetRefusedMayBeSentAgain) {
  Make();
  peers_.set_prepared(
      WithReason(absl::NotFoundError("no tensor"), reasons::kUnknownTensor));
  absl::StatusOr<std::shared_ptr<Transfer>> refused = Submit("r1");
  ASSERT_TRUE(refused.ok());
  ASSERT_TRUE(observer_.WaitFinished(1));
  EXPECT_EQ(End(**refused).second, "UNKNOWN_TENSOR");
  peers_.set_prepared(testing::MakePrepared(layout_));
  std::shared_ptr<Transfer> fixed = Start("r1", {2});  // other content, same id
  ASSERT_NE(fixed, nullptr);
  EXPECT_NE(fixed->id(), (*refused)->id());
}

TEST_F(EngineTest, IdenticalRequestGetsTheSameTransfer) {
  Make();
  std::shared_ptr<Transfer> t = Start("r1");
  absl::StatusOr<std::shared_ptr<Transfer>> again = Submit("r1");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, t);
  EXPECT_EQ(peers_.specs().size(), 1u);
}

TEST_F(EngineTest, FinishedTransfersAreForgottenInTime) {
  EngineOptions o = Options();
  o.finished_kept_for = absl::Seconds(10);
  Make(o);
  std::shared_ptr<Transfer> t = Start("r1");
  fabric_.CompleteAll();
  Verdict(5, Verdict::kCompleted);
  Advance(absl::Seconds(5));
  engine_->Tick(now());
  EXPECT_TRUE(engine_->Find(t->id(), "").ok());
  Advance(absl::Seconds(6));
  engine_->Tick(now());
  EXPECT_EQ(ReasonOf(engine_->Find(t->id(), "").status()), "UNKNOWN_TRANSFER");
  EXPECT_EQ(ReasonOf(engine_->Find("", "r1").status()), "UNKNOWN_TRANSFER");
}

TEST_F(EngineTest, StrayVerdictsAndCompletionsAreCountedAndIgnored) {
  Make();
  std::shared_ptr<Transfer> t = Start("r1");
  Verdict(99, Verdict::kCompleted);  // no live transfer has slot 99
  EXPECT_EQ(engine_->stray_verdicts(), 1u);
  engine_->OnCompletion(Landed(0));  // a notice's
  engine_->OnCompletion(Landed(EncodeWrId(WrId{12345, 0, 1})));
  EXPECT_EQ(engine_->stray_completions(), 1u);
  std::vector<Posted> writes = fabric_.Take();
  fabric_.Complete(writes[0]);
  fabric_.Complete(writes[0]);  // a buggy fabric says it twice
  EXPECT_EQ(engine_->stray_completions(), 2u);
  EXPECT_EQ(t->Status().progress().bytes_done(), 4096u);
  EXPECT_FALSE(IsTerminal(t->state()));
}

TEST_F(EngineTest, MessagesQuoteAtMost64BytesOfWhatTheClientSent) {
  Make();
  v1::TransferRequest request = testing::MakeRequest("r1", "src", {0}, "dst", {0});
  const std::string node(1000, 'n');
  request.mutable_target()->set_node(node);
  absl::StatusOr<std::shared_ptr<Transfer>> t =
      engine_->Submit(request, absl::InfiniteFuture());
  EXPECT_EQ(ReasonOf(t.status()), "UNKNOWN_NODE");
  EXPECT_LT(t.status().message().size(), 64u + 40u);
  EXPECT_LT(engine_->Find("", std::string(128, 'x')).status().message().size(),
            64u + 40u);
}

TEST_F(EngineTest, ShutdownJoinsFailsWhatRunsAndSurvivesTheFlush) {
  Make();
  std::shared_ptr<Transfer> running = Start("running");  // slot 5, writes in flight
  peers_.Block();
  absl::StatusOr<std::shared_ptr<Transfer>> preparing = Submit("preparing", {1});
  ASSERT_TRUE(preparing.ok());
  ASSERT_TRUE(peers_.WaitForPrepares(2));
  std::thread shutdown([&] { engine_->Shutdown(); });
  // Once Shutdown has stopped it, the target answers; Shutdown waits for that answer.
  while ((*preparing)->state() != State::kStopping) std::this_thread::yield();
  peers_.Release();
  shutdown.join();
  // Shutdown returned after the prepare call it waited for had returned.
  EXPECT_EQ(peers_.prepares_returned(), 2);
  EXPECT_EQ(End(**preparing),
            std::make_pair(absl::StatusCode::kUnavailable, std::string("SHUTTING_DOWN")));
  EXPECT_EQ(Posts(ImmOp::kAbort), 1);          // the slot it had been given, let go of
  EXPECT_FALSE(IsTerminal(running->state()));  // its writes still name it
  absl::StatusOr<std::shared_ptr<Transfer>> refused = Submit("after");
  EXPECT_EQ(ReasonOf(refused.status()), "SHUTTING_DOWN");
  const size_t posts = fabric_.posts();
  // The fabric goes: its writes (running's four, the abort) fail UNAVAILABLE.
  EXPECT_EQ(fabric_.FlushAll(), 5u);
  EXPECT_EQ(End(*running),
            std::make_pair(absl::StatusCode::kUnavailable, std::string("SHUTTING_DOWN")));
  EXPECT_EQ(fabric_.posts(), posts);  // nothing posted after Shutdown
  engine_->OnCompletion(Landed(EncodeWrId(WrId{1, 0, 1})));
  engine_.reset();
}

TEST_F(EngineTest, ShutdownWithTheHousekeepingThreadRunning) {
  EngineOptions o = Options();
  o.housekeeping_thread = true;
  o.clock = [] { return absl::Now(); };
  Make(o);
  std::shared_ptr<Transfer> t = Start("r1");
  engine_->Shutdown();
  fabric_.FlushAll();
  EXPECT_EQ(End(*t).second, "SHUTTING_DOWN");
}

// --- Calls to targets, in a lane per target ---

// Targets node-b, node-c and node-d, and this node (node-a) for in-node moves.
class LaneEngineTest : public EngineTest {
 protected:
  void SetUp() override {
    EngineTest::SetUp();
    peers_.AddNode("node-c");
    peers_.AddNode("node-d");
  }
  // A test that failed with a target still held must not hang the engine's shutdown.
  void TearDown() override {
    peers_.Release("node-c");
    peers_.Release("node-d");
    EngineTest::TearDown();
  }
  EngineOptions Options() {
    EngineOptions o = EngineTest::Options();
    o.in_node_moves = true;
    o.prepare_threads = 2;
    o.prepare_threads_per_target = 1;
    return o;
  }
  absl::StatusOr<std::shared_ptr<Transfer>> SubmitTo(const std::string& target_node,
                                                     const std::string& rid) {
    v1::TransferRequest request = testing::MakeRequest(rid, "src", {0}, "dst", {0});
    request.mutable_target()->set_node(target_node);
    return engine_->Submit(request, absl::InfiniteFuture());
  }
  // Runs `t`, prepared already, to its end: its writes land, its target says so.
  void Finish(const Transfer& t) {
    ASSERT_TRUE(fabric_.WaitForPending(1));
    fabric_.CompleteAll();
    // The fake gives the n-th prepare (from 0) slot 5 + n.
    const std::vector<IncomingSpec> specs = peers_.specs();
    uint32_t n = 0;
    while (n < specs.size() && specs[n].transfer_id != t.id()) ++n;
    ASSERT_LT(n, specs.size());
    engine_->OnVerdict(
        t.request().target().node(),
        EncodeVerdict(SlotId{5 + n, 300}, static_cast<uint8_t>(Verdict::kCompleted)));
    EXPECT_EQ(t.state(), State::kCompleted);
  }
};

TEST_F(LaneEngineTest, ATargetThatHangsDelaysNoOtherTargetNorInNodeMoves) {
  Make(Options());
  peers_.Block("node-c");
  std::vector<std::shared_ptr<Transfer>> stuck;
  for (int i = 0; i < 3; ++i) {  // more than the engine's prepare threads
    absl::StatusOr<std::shared_ptr<Transfer>> t =
        SubmitTo("node-c", absl::StrCat("c", i));
    ASSERT_TRUE(t.ok()) << t.status();
    stuck.push_back(*t);
  }
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-c", 1));
  absl::StatusOr<std::shared_ptr<Transfer>> other = SubmitTo("node-b", "b");
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-b", 1));
  Finish(**other);
  absl::StatusOr<std::shared_ptr<Transfer>> local = SubmitTo("node-a", "a");
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-a", 1));
  Finish(**local);
  // All the while node-c's calls held one thread (prepare_threads_per_target): its
  // others queued in its lane.
  EXPECT_EQ(peers_.prepares_of("node-c"), 1);
  for (const auto& t : stuck) EXPECT_FALSE(IsTerminal(t->state()));
  peers_.Release("node-c");
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-c", 3));
}

TEST_F(LaneEngineTest, InNodeMovesHaveThreadsOfTheirOwn) {
  Make(Options());
  // Two targets that hang hold both prepare threads.
  peers_.Block("node-c");
  peers_.Block("node-d");
  ASSERT_TRUE(SubmitTo("node-c", "c").ok());
  ASSERT_TRUE(SubmitTo("node-d", "d").ok());
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-c", 1));
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-d", 1));
  absl::StatusOr<std::shared_ptr<Transfer>> local = SubmitTo("node-a", "a");
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-a", 1));
  Finish(**local);
  // A third remote target waits for a prepare thread: the bound is prepare_threads
  // targets that hang at once.
  absl::StatusOr<std::shared_ptr<Transfer>> third = SubmitTo("node-b", "b");
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(peers_.prepares_of("node-b"), 0);
  peers_.Release("node-c");
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-b", 1));
  peers_.Release("node-d");
}

// By default the lane refuses nothing the engine admitted: every transfer in flight
// may go to one target (a decode node), even while that target is slow to answer.
TEST_F(LaneEngineTest, EveryAdmittedTransferMayWaitForOneTarget) {
  EngineOptions o = Options();
  o.max_active_transfers = 40;
  o.max_active_transfers_per_requester = 40;
  Make(o);
  peers_.Block("node-c");
  std::vector<std::shared_ptr<Transfer>> waiting;
  for (int i = 0; i < 40; ++i) {
    absl::StatusOr<std::shared_ptr<Transfer>> t =
        SubmitTo("node-c", absl::StrCat("c", i));
    ASSERT_TRUE(t.ok()) << t.status();
    waiting.push_back(*t);
  }
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-c", 1));
  EXPECT_EQ(engine_->prepares_refused(), 0u);
  for (const auto& t : waiting) EXPECT_FALSE(IsTerminal(t->state()));
  peers_.Release("node-c");
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-c", 40));
  EXPECT_EQ(engine_->prepares_refused(), 0u);
}

TEST_F(LaneEngineTest, ATargetsFullLaneFailsTheTransferWithAReason) {
  EngineOptions o = Options();
  o.prepare_queue_per_target = 2;
  Make(o);
  peers_.Block("node-c");
  ASSERT_TRUE(SubmitTo("node-c", "c0").ok());  // asking
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-c", 1));
  absl::StatusOr<std::shared_ptr<Transfer>> queued = SubmitTo("node-c", "c1");
  ASSERT_TRUE(queued.ok()) << queued.status();
  absl::StatusOr<std::shared_ptr<Transfer>> refused = SubmitTo("node-c", "c2");
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(End(**refused), std::make_pair(absl::StatusCode::kResourceExhausted,
                                           std::string("PREPARE_QUEUE_FULL")));
  EXPECT_EQ(engine_->prepares_refused(), 1u);
  EXPECT_FALSE(IsTerminal((*queued)->state()));
  // Never accepted: the same request may be sent again.
  peers_.Release("node-c");
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-c", 2));
  absl::StatusOr<std::shared_ptr<Transfer>> again = SubmitTo("node-c", "c2");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE((*again)->id(), (*refused)->id());
  ASSERT_TRUE(peers_.WaitForPreparesOf("node-c", 3));
}

// fuselink with nothing to borrow (borrow_depth 0) and a direct queue of 2.
class SharedNicEngineTest : public EngineTest {
 protected:
  SharedNicEngineTest()
      : EngineTest(sched::Policy::kFuselink,
                   sched::Limits{.direct_depth = 2, .borrow_depth = 0}) {}
};

// Two transfers of one GPU share its NIC's queue. The first fills it and refills it
// as its chunks land; the second still gets a chunk on the NIC at once, rather than
// waiting for the first to end (a target gives up on a transfer that sends nothing
// for --incoming_start_timeout_ms).
TEST_F(SharedNicEngineTest, ATransferStartingBehindASiblingIsNotShutOut) {
  Make();
  ASSERT_TRUE(Submit("a", {0}).ok());
  ASSERT_TRUE(fabric_.WaitForPending(2));
  ASSERT_TRUE(Submit("b", {1}).ok());
  ASSERT_TRUE(fabric_.WaitForPending(3));  // b's first chunk, over the depth
  std::vector<Posted> first = fabric_.Take();
  ASSERT_EQ(first.size(), 3u);
  std::set<uint32_t> jobs;
  for (const Posted& p : first) {
    EXPECT_EQ(p.nic, 0);
    jobs.insert(DecodeWrId(p.op.wr_id).job);
  }
  EXPECT_EQ(jobs.size(), 2u);
  // They land: each goes on with one chunk, and the queue is back to its depth.
  for (const Posted& p : first) fabric_.Complete(p);
  ASSERT_TRUE(fabric_.WaitForPending(2));
  jobs.clear();
  for (const Posted& p : fabric_.pending()) jobs.insert(DecodeWrId(p.op.wr_id).job);
  EXPECT_EQ(jobs.size(), 2u);
  EXPECT_EQ(fabric_.pending_count(), 2u);
  EXPECT_EQ(scheduler_.Stats(0).in_flight, 2u);
}

class RelayEngineTest : public EngineTest {
 protected:
  RelayEngineTest()
      : EngineTest(sched::Policy::kFuselink,
                   sched::Limits{.direct_depth = 1, .borrow_depth = 2}),
        pool_(2, /*slots=*/1, /*cap=*/2) {
    gpu_relay_ = &pool_;
  }
  FakeRelayPool pool_;
};

TEST_F(RelayEngineTest, FencesWaitOnTheEnginesWorkerNotOnTheFabricsThread) {
  pool_.SetCap(1);  // no growth: the chunks stay where the test put them
  absl::StatusOr<memory::TensorInfo> gpu =
      testing::RegisterGpuTensor(registry_, "gpu-src", kLayout, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  peers_.set_prepared(testing::MakePrepared(layout_, /*idle_mask=*/0b10));
  Make();
  absl::StatusOr<std::shared_ptr<Transfer>> t = engine_->Submit(
      testing::MakeRequest("r1", "gpu-src", {0}, "dst", {0}), absl::InfiniteFuture());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(fabric_.WaitForPending(2));
  std::vector<Posted> writes = fabric_.Take();
  const Posted* borrowed = nullptr;
  for (const Posted& p : writes) {
    if (p.nic == 1) borrowed = &p;
  }
  ASSERT_NE(borrowed, nullptr);
  EXPECT_NE(borrowed->op.after, nullptr);
  fabric_.Complete(*borrowed, absl::UnavailableError("connection lost"));
  ASSERT_TRUE(pool_.WaitForReleases(0));
  const std::vector<std::thread::id> waiters = pool_.fence_waiters();
  ASSERT_EQ(waiters.size(), 1u);
  EXPECT_NE(waiters[0], std::this_thread::get_id());  // not the completing thread
}

TEST_F(RelayEngineTest, ThePoolGrowsOffTheDataPath) {
  absl::StatusOr<memory::TensorInfo> gpu =
      testing::RegisterGpuTensor(registry_, "gpu-src", kLayout, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  peers_.set_prepared(testing::MakePrepared(layout_, /*idle_mask=*/0b10));
  Make();
  ASSERT_TRUE(engine_
                  ->Submit(testing::MakeRequest("r1", "gpu-src", {0}, "dst", {0}),
                           absl::InfiniteFuture())
                  .ok());
  // One slot to begin with; the chunk that found none asked the worker to grow one,
  // and went once it had.
  EXPECT_TRUE(fabric_.WaitForPending(3));
  EXPECT_EQ(pool_.grown(), 1);
  int borrowed = 0;
  for (const Posted& p : fabric_.pending()) borrowed += p.nic == 1;
  EXPECT_EQ(borrowed, 2);
}

}  // namespace
}  // namespace fuselink::transfer
