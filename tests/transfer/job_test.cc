// One transfer's state machine (Job) event by event: the completion rule (the
// target's verdict, in any order against the writes), refusals, the questions for a
// verdict that did not come, and the source's own stops.
#include "tests/transfer/job_fixture.h"

namespace fuselink::transfer {
namespace {

using testing::JobTest;
using testing::kLayout;
using testing::kWindow;
using testing::OpOf;
using testing::Posted;

TEST_F(JobTest, CompletesOnlyOnTheTargetsCompletedVerdict) {
  Start();
  EXPECT_EQ(fabric_.pending_count(), kWindow);  // a block is 2 chunks x 2 layers
  LandData();
  std::optional<Posted> commit = TakeCommit();
  ASSERT_TRUE(commit.has_value());
  EXPECT_EQ(commit->op.bytes, 0u);
  EXPECT_EQ(ImmSlot(commit->op.imm), (SlotId{5, 300}));
  fabric_.Complete(*commit);
  // The commit's acknowledgement is the transport's; it decides nothing.
  EXPECT_FALSE(finished_);
  EXPECT_EQ(status().state(), v1::TRANSFER_STATE_RUNNING);
  Verdict(Verdict::kCompleted);
  EXPECT_TRUE(finished_);
  EXPECT_EQ(state(), State::kCompleted);
  EXPECT_EQ(status().progress().bytes_done(), 2 * 8192u);
  EXPECT_EQ(Posts(ImmOp::kCommit), 1);
  EXPECT_EQ(Posts(ImmOp::kAbort), 0);
  EXPECT_FALSE(free_request_id_);  // a completed request id stays its transfer's
  // The source's engine hears it too: its blocks left, every layer.
  ASSERT_TRUE(outgoing_.has_value());
  EXPECT_TRUE(outgoing_->outgoing());
  EXPECT_EQ(outgoing_->code(), 0);
  EXPECT_EQ(outgoing_->tensor(), "src");
  EXPECT_EQ(outgoing_->target_node(), "node-b");
  EXPECT_EQ(outgoing_->bytes(), 2 * 8192u);
  EXPECT_EQ(std::vector<uint32_t>(outgoing_->layers_done().begin(),
                                  outgoing_->layers_done().end()),
            (std::vector<uint32_t>{0, 1}));
  EXPECT_TRUE(outgoing_->failed_block_ids().empty());
}

class EveryVerdictTest : public JobTest, public ::testing::WithParamInterface<uint8_t> {};

TEST_P(EveryVerdictTest, EndsWithTheVerdictsCodeAndReason) {
  Start();
  Commit();
  Do([&](Job& j, JobEffects* fx)
         ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { j.OnVerdict(GetParam(), fx); });
  const absl::Status want = VerdictStatus(GetParam(), "node-b");
  ASSERT_FALSE(want.ok());
  EXPECT_TRUE(finished_);
  EXPECT_EQ(state(), State::kFailed);
  EXPECT_EQ(End().first, want.code());
  EXPECT_EQ(End().second, ReasonOf(want));
  EXPECT_EQ(Posts(ImmOp::kAbort), 0);  // the target has ended its slot already
  EXPECT_EQ(free_request_id_, absl::IsUnavailable(want) || absl::IsAborted(want));
}

INSTANTIATE_TEST_SUITE_P(Verdicts, EveryVerdictTest,
                         ::testing::Values(1, 2, 3, 4, 5, 6, 7, 255, 200));

TEST_F(JobTest, VerdictBeforeTheCommitsOwnCompletion) {
  Start();
  LandData();
  std::optional<Posted> commit = TakeCommit();
  ASSERT_TRUE(commit.has_value());
  Verdict(Verdict::kCompleted);
  EXPECT_FALSE(finished_);  // the commit's write still names the job
  fabric_.Complete(*commit);
  EXPECT_TRUE(finished_);
  EXPECT_EQ(state(), State::kCompleted);
}

TEST_F(JobTest, VerdictWhileDataIsInFlightEndsOnceItDrains) {
  Start({0, 1});  // 8 chunks, 4 in flight
  std::vector<Posted> first = fabric_.Take();
  ASSERT_EQ(first.size(), kWindow);
  fabric_.Complete(first[0]);
  const size_t posts = fabric_.posts();
  Verdict(Verdict::kSourceIdle);
  EXPECT_EQ(fabric_.posts(), posts);  // nothing more is posted
  for (size_t i = 1; i < first.size(); ++i) {
    EXPECT_FALSE(finished_);
    fabric_.Complete(first[i]);
  }
  for (const Posted& p : fabric_.Take()) fabric_.Complete(p);  // the one posted after [0]
  EXPECT_TRUE(finished_);
  EXPECT_EQ(End(),
            std::make_pair(absl::StatusCode::kUnavailable, std::string("SOURCE_IDLE")));
  EXPECT_EQ(Posts(ImmOp::kCommit), 0);
  EXPECT_EQ(Posts(ImmOp::kAbort), 0);
}

TEST_F(JobTest, CompletedVerdictBeforeTheCommitBreaksTheProtocol) {
  Start();
  Verdict(Verdict::kCompleted);
  fabric_.CompleteAll();
  EXPECT_TRUE(finished_);
  EXPECT_EQ(End(),
            std::make_pair(absl::StatusCode::kInternal, std::string("TARGET_PROTOCOL")));
  EXPECT_EQ(Posts(ImmOp::kCommit), 0);
}

TEST_F(JobTest, RepeatedVerdictsChangeNothing) {
  Start();
  Commit();
  Verdict(Verdict::kIncompleteCommit);
  Verdict(Verdict::kCompleted);
  EXPECT_EQ(End(), std::make_pair(absl::StatusCode::kDataLoss,
                                  std::string("INCOMPLETE_COMMIT")));
}

TEST_F(JobTest, RefusedWriteIsNotAFailoverAndEndsWithTheTargetsVerdict) {
  Start({0, 1});
  std::vector<Posted> first = fabric_.Take();
  ASSERT_EQ(first.size(), kWindow);
  for (const Posted& p : first) EXPECT_EQ(p.nic, 0);  // static: the direct NIC
  fabric_.Refuse(first[0], fabric::Refusal::kNoWindow);
  for (size_t i = 1; i < first.size(); ++i) fabric_.Complete(first[i]);
  EXPECT_EQ(fabric_.pending_count(), 0u);            // no chunk went again, on any NIC
  EXPECT_EQ(scheduler_.Stats(0).failed_chunks, 0u);  // the NIC is not to blame
  EXPECT_FALSE(finished_);                           // the target decides
  Verdict(Verdict::kOwnerExited);
  EXPECT_TRUE(finished_);
  EXPECT_EQ(End(), std::make_pair(absl::StatusCode::kFailedPrecondition,
                                  std::string("OWNER_EXITED")));
  EXPECT_EQ(Posts(ImmOp::kAbort), 0);
  EXPECT_EQ(Posts(ImmOp::kCommit), 0);
}

TEST_F(JobTest, RefusalWithoutVerdictAsksTheTarget) {
  Start();
  std::vector<Posted> first = fabric_.Take();
  fabric_.Refuse(first[0], fabric::Refusal::kNoWindow);
  for (size_t i = 1; i < first.size(); ++i) fabric_.Complete(first[i]);
  EXPECT_EQ(timer(), now_ + absl::Seconds(1));
  Timer();
  EXPECT_EQ(queries_, 0);  // not yet due
  now_ += absl::Seconds(1);
  Timer();
  EXPECT_EQ(queries_, 1);
  Reply(std::optional<absl::Status>(
      WithReason(absl::DataLossError("target node 'node-b': missing bytes"),
                 reasons::kIncompleteCommit)));
  EXPECT_TRUE(finished_);
  EXPECT_EQ(End(), std::make_pair(absl::StatusCode::kDataLoss,
                                  std::string("INCOMPLETE_COMMIT")));
  EXPECT_EQ(Posts(ImmOp::kAbort), 0);
}

TEST_F(JobTest, RefusalTheTargetHasNotDecidedEndsWithTheRefusal) {
  Start();
  std::vector<Posted> first = fabric_.Take();
  fabric_.Refuse(first[0], fabric::Refusal::kOutsideWindow);
  for (size_t i = 1; i < first.size(); ++i) fabric_.Complete(first[i]);
  now_ += absl::Seconds(1);
  Timer();
  ASSERT_EQ(queries_, 1);
  Reply(std::optional<absl::Status>());  // still open there
  EXPECT_EQ(End(),
            std::make_pair(absl::StatusCode::kOutOfRange, std::string("OUTSIDE_WINDOW")));
  EXPECT_EQ(Posts(ImmOp::kAbort), 1);  // so that the target lets go of its slot
}

TEST_F(JobTest, RefusalWhoseQuestionsFailEndsWithTheRefusal) {
  Start();
  std::vector<Posted> first = fabric_.Take();
  fabric_.Refuse(first[0], fabric::Refusal::kNotYourWindow);
  for (size_t i = 1; i < first.size(); ++i) fabric_.Complete(first[i]);
  for (int i = 0; i < 3; ++i) {
    now_ += absl::Seconds(1);
    Timer();
    ASSERT_EQ(queries_, i + 1);
    EXPECT_FALSE(finished_);
    Reply(WithReason(absl::UnavailableError("unreachable"), reasons::kPeerUnreachable));
  }
  EXPECT_TRUE(finished_);
  EXPECT_EQ(End(), std::make_pair(absl::StatusCode::kPermissionDenied,
                                  std::string("WINDOW_NOT_YOURS")));
}

TEST_F(JobTest, NoVerdictAtAllIsNoVerdict) {
  Start();
  Commit();
  int asked = 0;
  for (int i = 0; i < 10 && !finished_; ++i) {
    now_ = timer();
    Timer();
    if (queries_ > asked) {
      asked = queries_;
      Reply(std::optional<absl::Status>());  // the target holds it open
    }
  }
  EXPECT_TRUE(finished_);
  EXPECT_EQ(End(),
            std::make_pair(absl::StatusCode::kUnavailable, std::string("NO_VERDICT")));
  EXPECT_GE(queries_, 2);
  EXPECT_TRUE(free_request_id_);  // UNAVAILABLE: the caller may retry the same id
}

TEST_F(JobTest, AnsweredQuestionCompletesTheTransfer) {
  Start();
  Commit();
  now_ += absl::Seconds(1);
  Timer();
  ASSERT_EQ(queries_, 1);
  Reply(std::optional<absl::Status>(absl::OkStatus()));
  EXPECT_EQ(state(), State::kCompleted);
}

TEST_F(JobTest, DeadlineStopsTheSourceBeforeItCommitted) {
  Start({0, 1}, now_ + absl::Seconds(2));
  EXPECT_EQ(timer(), now_ + absl::Seconds(2));
  std::vector<Posted> first = fabric_.Take();
  now_ += absl::Seconds(2);
  Timer();
  EXPECT_FALSE(finished_);  // its writes are still out
  for (const Posted& p : first) fabric_.Complete(p);
  EXPECT_TRUE(finished_);
  EXPECT_EQ(End(),
            std::make_pair(absl::StatusCode::kDeadlineExceeded, std::string("DEADLINE")));
  EXPECT_EQ(Posts(ImmOp::kAbort), 1);
  EXPECT_FALSE(free_request_id_);
}

TEST_F(JobTest, AfterTheCommitTheDeadlineIsTheTargetsToJudge) {
  Start({0}, now_ + absl::Seconds(2));
  Commit();
  now_ += absl::Seconds(3);
  Timer();  // due: the verdict wait, past the deadline but one question first
  EXPECT_FALSE(finished_);
  EXPECT_EQ(queries_, 1);
  Verdict(Verdict::kCompleted);
  EXPECT_EQ(state(), State::kCompleted);
}

TEST_F(JobTest, CancelBeforeTheCommitOnly) {
  Start();
  absl::Status cancelled =
      WithReason(absl::CancelledError("cancelled"), reasons::kCancelled);
  Commit();
  absl::Status refused;
  Do([&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
    refused = j.Stop(cancelled, false, fx);
  });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(refused), "TRANSFER_FINISHED");
  Verdict(Verdict::kCompleted);
  EXPECT_EQ(state(), State::kCompleted);
}

TEST_F(JobTest, CancelMidTransfer) {
  Start({0, 1});
  absl::Status ok;
  Do([&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
    ok = j.Stop(WithReason(absl::CancelledError("cancelled"), reasons::kCancelled), false,
                fx);
  });
  EXPECT_TRUE(ok.ok());
  EXPECT_FALSE(finished_);
  fabric_.CompleteAll();
  EXPECT_TRUE(finished_);
  EXPECT_EQ(state(), State::kCancelled);
  EXPECT_EQ(Posts(ImmOp::kAbort), 1);
  // The window held layer 0 of both blocks when it stopped: that layer left whole,
  // layer 1 of neither did, so both blocks are reported failed.
  ASSERT_TRUE(outgoing_.has_value());
  EXPECT_EQ(outgoing_->code(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(std::vector<uint32_t>(outgoing_->layers_done().begin(),
                                  outgoing_->layers_done().end()),
            (std::vector<uint32_t>{0}));
  EXPECT_EQ(std::vector<uint32_t>(outgoing_->failed_block_ids().begin(),
                                  outgoing_->failed_block_ids().end()),
            (std::vector<uint32_t>{0, 1}));
  absl::Status again;
  Do([&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
    again = j.Stop(absl::CancelledError("x"), false, fx);
  });
  EXPECT_EQ(ReasonOf(again), "TRANSFER_FINISHED");
}

TEST_F(JobTest, StopWhileTheTargetPreparesEndsOnItsAnswerAndTellsIt) {
  prepare_now_ = false;
  Start();
  Do([&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
    EXPECT_TRUE(
        j.Stop(WithReason(absl::CancelledError("c"), reasons::kCancelled), false, fx)
            .ok());
  });
  EXPECT_FALSE(finished_);  // the prepare call is out
  Accept(testing::MakePrepared(layout_));
  EXPECT_TRUE(finished_);
  EXPECT_EQ(state(), State::kCancelled);
  EXPECT_EQ(Posts(ImmOp::kData), 0);
  EXPECT_EQ(Posts(ImmOp::kAbort), 1);  // the target reserved a slot: let it go
  EXPECT_TRUE(free_request_id_);       // never accepted here: the id may start anew
  EXPECT_EQ(status().state(), v1::TRANSFER_STATE_CANCELLED);
}

TEST_F(JobTest, TargetRefusalBeforeAcceptanceFailsWithItsCode) {
  prepare_now_ = false;
  Start();
  Do([&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
    j.OnPrepared(WithReason(absl::NotFoundError("no tensor"), reasons::kUnknownTensor),
                 absl::UnknownError("not planned"), fx);
  });
  EXPECT_TRUE(finished_);
  EXPECT_TRUE(free_request_id_);
  ASSERT_TRUE(outgoing_.has_value());  // nothing left: every block failed
  EXPECT_EQ(outgoing_->failed_block_ids_size(), 1);
  EXPECT_TRUE(outgoing_->layers_done().empty());
  EXPECT_EQ(End(),
            std::make_pair(absl::StatusCode::kNotFound, std::string("UNKNOWN_TENSOR")));
}

TEST_F(JobTest, LayerByLayerSendsOnlyTheLayersToldReady) {
  layer_by_layer_ = true;
  Start();                            // one block: 2 chunks in each of the 2 layers
  EXPECT_EQ(Posts(ImmOp::kData), 0);  // nothing is computed yet
  auto ready = [&](uint32_t end) {
    absl::Status s;
    Do([&](Job& j, JobEffects* fx)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { s = j.SetLayersReady(end, fx); });
    return s;
  };
  EXPECT_TRUE(ready(1).ok());
  EXPECT_EQ(Posts(ImmOp::kData), 2);  // layer 0 only
  fabric_.CompleteAll();
  EXPECT_EQ(Posts(ImmOp::kCommit), 0);  // layer 1 is still being computed
  EXPECT_TRUE(ready(1).ok());           // told again: nothing changes
  EXPECT_EQ(Posts(ImmOp::kData), 2);
  EXPECT_EQ(ReasonOf(ready(3)), "LAYER_OUT_OF_RANGE");
  EXPECT_TRUE(ready(2).ok());
  EXPECT_EQ(Posts(ImmOp::kData), 4);
  LandData();
  std::optional<Posted> commit = TakeCommit();
  ASSERT_TRUE(commit.has_value());
  fabric_.Complete(*commit);
  Verdict(Verdict::kCompleted);
  EXPECT_EQ(state(), State::kCompleted);
  EXPECT_EQ(ReasonOf(ready(2)), "TRANSFER_FINISHED");
}

TEST_F(JobTest, LayersReadyBeforeTheTargetAcceptedAreKept) {
  layer_by_layer_ = true;
  prepare_now_ = false;
  Start();
  absl::Status s;
  Do([&](Job& j, JobEffects* fx)
         ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { s = j.SetLayersReady(2, fx); });
  EXPECT_TRUE(s.ok());
  Accept(testing::MakePrepared(layout_));
  EXPECT_EQ(Posts(ImmOp::kData), 4);  // both layers, at once
}

TEST_F(JobTest, LayersReadyNeedsALayerByLayerTransfer) {
  Start();
  absl::Status s;
  Do([&](Job& j, JobEffects* fx)
         ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { s = j.SetLayersReady(1, fx); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(s), "NOT_LAYER_BY_LAYER");
}

TEST_F(JobTest, AnExpiredLeaseStopsTheSourceAndARenewedOneDoesNot) {
  lease_ms_ = 1000;
  layer_by_layer_ = true;  // nothing is sent: only the lease can end it
  Start();
  EXPECT_EQ(timer(), now_ + absl::Seconds(1));
  auto extend = [&](uint32_t ms) {
    absl::Status s;
    Do([&](Job& j, JobEffects* fx)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { s = j.ExtendLease(ms, fx); });
    return s;
  };
  now_ += absl::Milliseconds(900);
  ASSERT_TRUE(extend(0).ok());  // the request's own lease, from now
  EXPECT_EQ(timer(), now_ + absl::Seconds(1));
  ASSERT_TRUE(extend(100).ok());  // never sooner than before
  EXPECT_EQ(timer(), now_ + absl::Seconds(1));
  now_ += absl::Milliseconds(999);
  Timer();
  EXPECT_FALSE(finished_);
  now_ += absl::Milliseconds(1);
  Timer();
  ASSERT_TRUE(finished_);
  EXPECT_EQ(End(), std::make_pair(absl::StatusCode::kDeadlineExceeded,
                                  std::string("LEASE_EXPIRED")));
  EXPECT_EQ(Posts(ImmOp::kAbort), 1);  // the target lets go of its slot too
  EXPECT_EQ(ReasonOf(extend(0)), "TRANSFER_FINISHED");
}

TEST_F(JobTest, AfterTheCommitTheLeaseNoLongerMatters) {
  lease_ms_ = 1000;
  Start();
  Commit();
  now_ += absl::Seconds(5);
  Timer();
  EXPECT_FALSE(finished_);
  Verdict(Verdict::kCompleted);
  EXPECT_EQ(state(), State::kCompleted);
}

TEST_F(JobTest, ExtendLeaseNeedsALease) {
  Start();
  absl::Status s;
  Do([&](Job& j, JobEffects* fx)
         ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { s = j.ExtendLease(1000, fx); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(s), "NO_LEASE");
}

TEST_F(JobTest, NothingIsPostedAfterShutdown) {
  Start();
  ctx_.posting_stopped.store(true);
  Do([&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
    EXPECT_TRUE(j.Stop(WithReason(absl::UnavailableError("stop"), reasons::kShuttingDown),
                       true, fx)
                    .ok());
  });
  const size_t posts = fabric_.posts();
  EXPECT_EQ(fabric_.FlushAll(), kWindow);  // the fabric's flush
  EXPECT_TRUE(finished_);
  EXPECT_EQ(fabric_.posts(), posts);  // no chunk again, no abort
  EXPECT_EQ(End(),
            std::make_pair(absl::StatusCode::kUnavailable, std::string("SHUTTING_DOWN")));
}

}  // namespace
}  // namespace fuselink::transfer
