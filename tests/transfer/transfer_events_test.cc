// The events a stream sees, driven by a scripted transfer and a fake sink.
#include <vector>

#include "agent/common/status_macros.h"
#include "agent/transfer/transfer.h"
#include "gtest/gtest.h"

namespace fuselink::transfer {
namespace {

// Records events; completes each write at once unless `hold` is set.
class FakeSink : public EventSink {
 public:
  void SendEvent(const v1::TransferEvent* event) override {
    events.push_back(*event);
    pending = true;
  }
  void End(const absl::Status& status) override {
    ended = true;
    end_status = status;
  }
  // Acknowledges writes until the stream has nothing more to send.
  void Drain(Transfer& t) {
    while (pending) {
      pending = false;
      t.OnWriteDone(sub, true);
    }
  }
  std::vector<v1::TransferEvent> events;
  bool pending = false;
  bool ended = false;
  absl::Status end_status;
  Transfer::Subscription* sub = nullptr;
};

Transfer MakeTransfer() {
  v1::TransferRequest request;
  request.set_request_id("r1");
  return Transfer("t1", request, "fp", {"rail0", "rail1"}, absl::InfiniteFuture());
}

TEST(TransferEvents, AcceptedLayersProgressThenCompleted) {
  Transfer t = MakeTransfer();
  FakeSink sink;
  t.Subscribe(&sink, &sink.sub);
  EXPECT_TRUE(sink.events.empty());  // nothing until the target accepts
  t.Accept(400, 4, 10, 2, "tcp", "stripe");
  sink.Drain(t);
  ASSERT_EQ(sink.events.size(), 1u);
  EXPECT_TRUE(sink.events[0].has_accepted());
  EXPECT_EQ(sink.events[0].accepted().total_bytes(), 400u);
  {
    absl::MutexLock lock(&t.mu());
    t.AddDone(0, 10, 100);
    t.AddDone(1, 10, 100);  // layer 10 done
    t.AddDone(1, 11, 200);  // layer 11 done
    t.SetState(State::kCompleted, absl::OkStatus());
  }
  t.Notify(false, absl::ZeroDuration());
  sink.Drain(t);
  ASSERT_EQ(sink.events.size(), 4u);
  EXPECT_EQ(sink.events[1].layer_done().layer(), 10u);
  EXPECT_EQ(sink.events[2].layer_done().layer(), 11u);
  ASSERT_TRUE(sink.events[3].has_completed());
  EXPECT_EQ(sink.events[3].completed().per_nic(0).bytes(), 100u);
  EXPECT_EQ(sink.events[3].completed().per_nic(1).bytes(), 300u);
  EXPECT_TRUE(sink.ended);
  EXPECT_TRUE(sink.end_status.ok());
  t.Unsubscribe(sink.sub);
}

// A held end is not heard, even by a stream whose write completes meanwhile on
// another thread, nor by Status, until the engine releases it (having let go of the
// tensor and the requester's share).
TEST(TransferEvents, AHeldEndIsHeardOnlyOnceReleased) {
  Transfer t = MakeTransfer();
  FakeSink sink;
  t.Subscribe(&sink, &sink.sub);
  t.Accept(100, 1, 0, 1, "tcp", "stripe");
  ASSERT_TRUE(sink.pending);  // the accepted event's write is outstanding
  {
    absl::MutexLock lock(&t.mu());
    t.AddDone(0, 0, 100);
    t.SetState(State::kCompleted, absl::OkStatus());
    t.HoldEnd();
  }
  sink.Drain(t);  // the write completes before the engine has released anything
  for (const v1::TransferEvent& e : sink.events) EXPECT_FALSE(e.has_completed());
  EXPECT_FALSE(sink.ended);
  EXPECT_EQ(t.Status().state(), v1::TRANSFER_STATE_RUNNING);

  t.ReleaseEnd();
  t.Notify(false, absl::ZeroDuration());
  sink.Drain(t);
  ASSERT_FALSE(sink.events.empty());
  EXPECT_TRUE(sink.events.back().has_completed());
  EXPECT_TRUE(sink.ended);
  EXPECT_EQ(t.Status().state(), v1::TRANSFER_STATE_COMPLETED);
  t.Unsubscribe(sink.sub);
}

TEST(TransferEvents, FailureBeforeAcceptanceFailsTheCallWithoutEvents) {
  Transfer t = MakeTransfer();
  FakeSink sink;
  t.Subscribe(&sink, &sink.sub);
  {
    absl::MutexLock lock(&t.mu());
    t.SetState(State::kFailed,
               WithReason(absl::NotFoundError("no tensor"), reasons::kUnknownTensor));
  }
  t.Notify(false, absl::ZeroDuration());
  EXPECT_TRUE(sink.events.empty());
  ASSERT_TRUE(sink.ended);
  EXPECT_EQ(sink.end_status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReasonOf(sink.end_status), "UNKNOWN_TENSOR");
}

TEST(TransferEvents, FailureAfterAcceptanceIsAnEventThenTheStatus) {
  Transfer t = MakeTransfer();
  FakeSink sink;
  t.Subscribe(&sink, &sink.sub);
  t.Accept(100, 1, 0, 1, "tcp", "static");
  sink.Drain(t);
  {
    absl::MutexLock lock(&t.mu());
    t.SetState(State::kFailed,
               WithReason(absl::UnavailableError("gone"), reasons::kPeerLost));
  }
  t.Notify(false, absl::ZeroDuration());
  sink.Drain(t);
  ASSERT_EQ(sink.events.size(), 2u);
  EXPECT_EQ(sink.events[1].failed().reason(), "PEER_LOST");
  EXPECT_EQ(sink.events[1].failed().code(),
            static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(sink.end_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(t.Status().state(), v1::TRANSFER_STATE_FAILED);
}

TEST(TransferEvents, AStreamThatGoesAwayIsFinishedAfterItsWrite) {
  Transfer t = MakeTransfer();
  FakeSink sink;
  t.Subscribe(&sink, &sink.sub);
  t.Accept(100, 1, 0, 1, "tcp", "static");
  ASSERT_TRUE(sink.pending);  // `accepted` is being written
  t.OnStreamCancelled(sink.sub);
  EXPECT_FALSE(sink.ended);  // not while a write is outstanding
  t.OnWriteDone(sink.sub, false);
  EXPECT_TRUE(sink.ended);
  EXPECT_EQ(sink.end_status.code(), absl::StatusCode::kCancelled);
}

TEST(TransferEvents, ProgressIsThrottled) {
  Transfer t = MakeTransfer();
  FakeSink sink;
  t.Subscribe(&sink, &sink.sub);
  t.Accept(1000, 10, 0, 1, "tcp", "static");
  sink.Drain(t);
  for (int i = 0; i < 5; ++i) {
    {
      absl::MutexLock lock(&t.mu());
      t.AddDone(0, 0, 10);
    }
    t.Notify(true, absl::Hours(1));
    sink.Drain(t);
  }
  // Accept's notification started the interval; none of the five passed it.
  EXPECT_EQ(sink.events.size(), 1u);
}

}  // namespace
}  // namespace fuselink::transfer
