// One transfer's window on the fabric, through its Job: failover on transport
// faults, back-pressure on full queues, writes completed in any order, repeated or
// forged, layers counted once, and GPU relay slots that never block the data path.
#include "tests/transfer/job_fixture.h"

namespace fuselink::transfer {
namespace {

using testing::FakeRelayPool;
using testing::JobTest;
using testing::kWindow;
using testing::OpOf;
using testing::Posted;

TEST_F(JobTest, TransportFaultFailsOverAndCountsTheChunkOnce) {
  Start();
  std::vector<Posted> first = fabric_.Take();
  ASSERT_EQ(first.size(), 4u);
  fabric_.Complete(first[1], absl::UnavailableError("connection lost"));
  std::vector<Posted> again = fabric_.Take();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].nic, 1);  // NIC 0 left the transfer's reach
  EXPECT_EQ(again[0].op.remote_offset, first[1].op.remote_offset);
  fabric_.Complete(again[0]);
  for (size_t i : {0, 2, 3}) fabric_.Complete(first[i]);
  Commit();
  Verdict(Verdict::kCompleted);
  EXPECT_EQ(state(), State::kCompleted);
  const v1::TransferStatus s = status();
  EXPECT_EQ(s.progress().bytes_done(), 2 * 8192u);  // once, not five chunks' worth
  EXPECT_EQ(s.progress().per_nic(1).bytes(), 4096u);
  EXPECT_EQ(scheduler_.Stats(0).failed_chunks, 1u);
  for (const Posted& p : fabric_.history()) {
    if (OpOf(p) == ImmOp::kCommit) {
      EXPECT_EQ(p.nic, 1);  // NIC 0 is out for this job
    }
  }
}

TEST_F(JobTest, EveryNicFailingIsPeerLost) {
  Start();
  fabric_.FailPosts(-1, absl::UnavailableError("not connected"));
  for (const Posted& p : fabric_.Take()) {
    fabric_.Complete(p, absl::UnavailableError("connection lost"));
  }
  EXPECT_TRUE(finished_);
  EXPECT_EQ(End(),
            std::make_pair(absl::StatusCode::kUnavailable, std::string("PEER_LOST")));
  EXPECT_EQ(Posts(ImmOp::kCommit), 0);
  EXPECT_TRUE(free_request_id_);
}

TEST_F(JobTest, FullQueueDelaysDataAndNeverFailsIt) {
  fabric_.FailPosts(-1, absl::ResourceExhaustedError("queue full"), 1);
  Start();
  EXPECT_GE(waits_, 1);  // it asked to wait, having posted nothing
  EXPECT_EQ(fabric_.pending_count(), 0u);
  EXPECT_EQ(timer(),
            now_ + ctx_.options.wait_backstop);  // nothing of its own will wake it
  Resume();
  EXPECT_EQ(fabric_.pending_count(), kWindow);
  Commit();
  Verdict(Verdict::kCompleted);
  EXPECT_EQ(state(), State::kCompleted);
  EXPECT_EQ(scheduler_.Stats(0).failed_chunks, 0u);
}

TEST_F(JobTest, FullQueueDelaysTheCommitAndNeverFailsIt) {
  Start();
  std::vector<Posted> data = fabric_.Take();
  fabric_.FailPosts(-1, absl::ResourceExhaustedError("queue full"));
  for (const Posted& p : data) fabric_.Complete(p);
  EXPECT_EQ(Posts(ImmOp::kCommit), 0);
  EXPECT_GE(waits_, 1);
  for (int i = 0; i < 3; ++i) {  // kicks, and the backstop, while the queue stays full
    now_ = timer();
    Timer();
    Resume();
  }
  EXPECT_FALSE(finished_);
  fabric_.ClearPostFailures();
  Resume();
  std::optional<Posted> commit = TakeCommit();
  ASSERT_TRUE(commit.has_value());
  fabric_.Complete(*commit);
  Verdict(Verdict::kCompleted);
  EXPECT_EQ(state(), State::kCompleted);
}

TEST_F(JobTest, RepeatedAndForgedCompletionsAreIgnored) {
  Start();
  std::vector<Posted> first = fabric_.Take();
  fabric_.Complete(first[0]);
  EXPECT_TRUE(last_known_);
  fabric_.Complete(first[0]);  // again
  EXPECT_FALSE(last_known_);
  fabric_.Complete(first[0], absl::UnavailableError("late fault"));
  EXPECT_FALSE(last_known_);
  Posted forged = first[1];
  forged.op.wr_id = EncodeWrId(WrId{7, 999, 1});
  fabric_.Complete(forged);
  EXPECT_FALSE(last_known_);
  for (size_t i = 1; i < first.size(); ++i) fabric_.Complete(first[i]);
  std::optional<Posted> commit = TakeCommit();
  ASSERT_TRUE(commit.has_value());
  fabric_.Complete(*commit);
  fabric_.Complete(*commit);
  EXPECT_FALSE(last_known_);
  EXPECT_EQ(status().progress().bytes_done(), 2 * 8192u);
  Verdict(Verdict::kCompleted);
  EXPECT_EQ(state(), State::kCompleted);
}

TEST_F(JobTest, CompletionsInAnyOrder) {
  Start({0, 1, 2});
  for (int round = 0; round < 20 && fabric_.pending_count() > 0; ++round) {
    std::vector<Posted> writes = fabric_.Take();
    for (auto it = writes.rbegin(); it != writes.rend(); ++it) {
      if (OpOf(*it) == ImmOp::kCommit) {
        Repost(*it);
      } else {
        fabric_.Complete(*it);
      }
    }
  }
  std::optional<Posted> commit = TakeCommit();
  ASSERT_TRUE(commit.has_value());
  fabric_.Complete(*commit);
  Verdict(Verdict::kCompleted);
  EXPECT_EQ(state(), State::kCompleted);
  EXPECT_EQ(status().progress().bytes_done(), 3 * 2 * 8192u);
}

TEST_F(JobTest, FullQueueDelaysTheAbortAndItGivesUpInTime) {
  Start();
  fabric_.FailPosts(-1, absl::ResourceExhaustedError("queue full"));
  Do([&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
    j.Stop(absl::CancelledError("c"), false, fx).IgnoreError();
  });
  for (const Posted& p : fabric_.Take()) fabric_.Complete(p);
  EXPECT_TRUE(finished_);
  EXPECT_EQ(Posts(ImmOp::kAbort), 0);
  fabric_.ClearPostFailures();
  Resume();
  EXPECT_EQ(Posts(ImmOp::kAbort), 1);
  EXPECT_EQ(timer(), absl::InfiniteFuture());
}

TEST_F(JobTest, LayerDoneOncePerLayerWhateverIsSentAgain) {
  Start();
  std::vector<Posted> first = fabric_.Take();
  fabric_.Complete(first[0], absl::UnavailableError("fault"));  // layer 0's first chunk
  fabric_.Complete(first[1]);
  for (const Posted& p : fabric_.Take()) fabric_.Complete(p);
  fabric_.Complete(first[2]);
  fabric_.Complete(first[3]);
  Commit();
  Verdict(Verdict::kCompleted);
  ASSERT_EQ(state(), State::kCompleted);
  // Two layers, two layer_done events, in the order they finished.
  struct Sink : EventSink {
    void SendEvent(const v1::TransferEvent* e) override { events.push_back(*e); }
    void End(const absl::Status&) override { ended = true; }
    std::vector<v1::TransferEvent> events;
    bool ended = false;
  } sink;
  Transfer::Subscription* sub = nullptr;
  job_->transfer()->Subscribe(&sink, &sub);
  while (!sink.ended) job_->transfer()->OnWriteDone(sub, true);
  int layer_done = 0;
  for (const auto& e : sink.events) layer_done += e.has_layer_done();
  EXPECT_EQ(layer_done, 2);
  job_->transfer()->Unsubscribe(sub);
}

// GPU sources borrow NICs through relay slots on the borrowed NIC's GPU.
class RelayJobTest : public JobTest {
 protected:
  RelayJobTest()
      : JobTest(sched::Policy::kFuselink,
                sched::Limits{.direct_depth = 1, .borrow_depth = 2}),
        pool_(2, /*slots=*/1, /*cap=*/2) {
    ctx_.gpu_relay = &pool_;
  }
  FakeRelayPool pool_;
};

TEST_F(RelayJobTest, BorrowedChunksGoThroughARelaySlotAndNothingWaitsOnItsFence) {
  Start({0}, absl::InfiniteFuture(), /*idle_mask=*/0b10, /*gpu=*/true);
  std::vector<Posted> first = fabric_.Take();
  ASSERT_GE(first.size(), 2u);
  EXPECT_EQ(first[0].nic, 0);
  const Posted& borrowed = first[1];
  EXPECT_EQ(borrowed.nic, 1);
  EXPECT_EQ(borrowed.op.local_key, 1001u);  // sent from the relay slot
  EXPECT_NE(borrowed.op.after, nullptr);    // once its copy is done
  EXPECT_EQ(pool_.staged(), 1);
  // The second borrowed chunk found no free slot: the pool grows off the data path.
  EXPECT_EQ(grow_relay_, 0b10u);
  EXPECT_EQ(pool_.grown(), 0);
  // A failed write's slot is released after its fence, by the engine's worker.
  fabric_.Complete(borrowed, absl::UnavailableError("fault"));
  ASSERT_EQ(after_fence_.size(), 1u);
  EXPECT_EQ(pool_.in_use(), 1);                // still held until its fence has passed
  EXPECT_TRUE(pool_.fence_waiters().empty());  // nobody waited under the lock
}

TEST_F(RelayJobTest, LandedBorrowedChunkReleasesItsSlotAtOnce) {
  Start({0}, absl::InfiniteFuture(), 0b10, true);
  std::vector<Posted> first = fabric_.Take();
  ASSERT_GE(first.size(), 2u);
  fabric_.Complete(first[1]);
  // Released at once, and taken again by the chunk that waited for it.
  EXPECT_EQ(pool_.staged(), 2);
  EXPECT_EQ(pool_.in_use(), 1);
  EXPECT_TRUE(after_fence_.empty());
  EXPECT_EQ(scheduler_.Stats(1).borrowed_bytes, 4096u);
}

}  // namespace
}  // namespace fuselink::transfer
