// Agents that stop dead (SIGSTOP) mid-transfer, neither closing nor answering: the
// fabric's bounds (--fabric_stall_timeout_ms, --fabric_ack_timeout_ms) and the
// landing's end what waits on them, and the tensors are let go. Times are printed as
// "bench:" lines; the waits are bounded generously and speed is not asserted.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "clients/cpp/scrape.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"

namespace fuselink::testing {
namespace {

// Two layers of 64 MiB, sent layer by layer in 16 MiB writes, one in flight: each test
// lets layer 0 land and then stops an agent, so the stop comes mid-transfer however
// fast the machine is (a stop inside a write's payload is TcpFabricBoundsTest's).
const v1::Layout kLayout = MakeLayout(2, 64, 1 << 20);
constexpr int kBoundMs = 1000;
constexpr int kIdleMs = 3000;
const std::vector<std::string> kFlags = {
    "--chunk_bytes=16777216", "--window_chunks=1",
    absl::StrCat("--fabric_stall_timeout_ms=", kBoundMs),
    absl::StrCat("--fabric_ack_timeout_ms=", kBoundMs),
    absl::StrCat("--incoming_idle_timeout_ms=", kIdleMs)};
// What a stopped peer may take to be given up on: a stopped source, the landing's idle
// timeout (a stop between writes leaves no frame begun; one inside a write also makes
// its connection close after the stall bound, but the source sends the write nowhere
// else); a stopped target, the ACK bound and then the verdict's give-up. Each plus
// slack for a loaded machine: a bound, not a speed.
const absl::Duration kSourceGiveUp =
    absl::Milliseconds(kIdleMs + kBoundMs) + absl::Seconds(15);
constexpr absl::Duration kGiveUp = absl::Seconds(60);

std::vector<uint32_t> AllBlocks() {
  std::vector<uint32_t> ids(kLayout.blocks_per_layer());
  for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
  return ids;
}

double Counter(AgentProcess& agent, const std::string& name,
               const std::map<std::string, std::string>& labels = {{"nic", "rail0"}}) {
  absl::StatusOr<std::string> metrics =
      client::HttpGet(agent.metrics_url(), kWaitTimeout);
  if (!metrics.ok()) return -1;
  absl::StatusOr<double> value = client::MetricValue(*metrics, name, labels);
  return value.ok() ? *value : -1;
}

class StallTest : public TwoNodeTest {
 protected:
  void RegisterPair() {
    absl::StatusOr<HostTensor> source = RegisterTensor(*a_, "big", kLayout, 11);
    ASSERT_TRUE(source.ok()) << source.status();
    absl::StatusOr<HostTensor> target = RegisterTensor(*b_, "big", kLayout, 12);
    ASSERT_TRUE(target.ok()) << target.status();
    source_ = *std::move(source);
    target_ = *std::move(target);
  }
  v1::TransferRequest Request(const std::string& id) {
    v1::TransferRequest request = MakeRequest(id, "big", AllBlocks(), "big", AllBlocks());
    request.set_layer_by_layer(true);
    return request;
  }
  // Lets layer 0 of `call` (transfer `id`) land and be told done: the transfer is then
  // half-way, with nothing on the wire, until layer 1 is said to be ready.
  void MoveFirstLayer(TransferCall& call, const std::string& id) {
    ASSERT_TRUE(call.WaitForEvent([](const v1::TransferEvent& e) {
      return e.has_accepted();
    })) << "not accepted";
    grpc::Status ready = LayersReady(a_->stub(), id, 1);
    ASSERT_TRUE(ready.ok()) << ready.error_message();
    ASSERT_TRUE(call.WaitForEvent([](const v1::TransferEvent& e) {
      return e.has_layer_done() && e.layer_done().layer() == 0;
    })) << "layer 0 did not land";
  }

  HostTensor source_;
  HostTensor target_;
};

// The source stops between two layers: the target's incoming transfer ends with a
// failure and a reason once idle, and its tensor can be unregistered (the landing let
// go of it). An in-node move on the target's node lands byte-exact meanwhile.
TEST_F(StallTest, SourceStoppedMidTransferLetsTheTargetGo) {
  ASSERT_NO_FATAL_FAILURE(StartNodes(kFlags, kFlags));
  ASSERT_NO_FATAL_FAILURE(RegisterPair());
  WatchCall watch(b_->stub(), "big");
  ASSERT_TRUE(watch.established());
  TransferCall call(a_->stub(), Request("stopped-source"));
  ASSERT_NO_FATAL_FAILURE(MoveFirstLayer(call, "stopped-source"));
  a_->Pause();
  const absl::Time stopped = absl::Now();

  absl::StatusOr<HostTensor> spare = RegisterTensor(*b_, "spare", kLayout, 16);
  ASSERT_TRUE(spare.ok()) << spare.status();
  absl::StatusOr<HostTensor> local = RegisterTensor(*b_, "local", kLayout, 17);
  ASSERT_TRUE(local.ok()) << local.status();
  v1::TransferRequest in_node =
      MakeRequest("in-node-meanwhile", "spare", AllBlocks(), "local", AllBlocks());
  in_node.mutable_source()->set_node(kNodeB);
  in_node.mutable_target()->set_node(kNodeB);
  TransferResult moved = RunTransfer(b_->stub(), in_node);
  EXPECT_TRUE(moved.status.ok()) << moved.status.error_message();
  EXPECT_TRUE(std::equal(spare->buffer->span().begin(), spare->buffer->span().end(),
                         local->buffer->span().begin()))
      << "the in-node move beside the stopped source is not byte-exact";

  ASSERT_TRUE(watch.WaitForEvents(1, kGiveUp));
  const double stop_to_verdict_ms = absl::ToDoubleMilliseconds(absl::Now() - stopped);
  const v1::WatchEvent event = watch.events()[0];
  std::printf(
      "bench: source stopped, target verdict after %.0f ms (code %d, reason %s, "
      "stalled connections %.0f)\n",
      stop_to_verdict_ms, event.code(), event.reason().c_str(),
      Counter(*b_, "fuselink_fabric_stalled_connections_total"));
  EXPECT_NE(event.code(), 0) << "the transfer ended before the stop: " << event.message();
  EXPECT_FALSE(event.reason().empty()) << event.message();
  EXPECT_LT(absl::Milliseconds(stop_to_verdict_ms), kSourceGiveUp);
  grpc::Status unregistered = UnregisterTensor(*b_, "big");
  EXPECT_TRUE(unregistered.ok()) << unregistered.error_message();
  a_->Resume();
  call.Finish();
}

// The target stops between two layers, and the source then sends the second: the
// source's stream and its outgoing watchers end with a failure and a reason, while an
// in-node move on the source's node, which the target has no part in, lands
// byte-exact meanwhile.
TEST_F(StallTest, TargetStoppedMidTransferEndsTheSourcesStream) {
  ASSERT_NO_FATAL_FAILURE(StartNodes(kFlags, kFlags));
  ASSERT_NO_FATAL_FAILURE(RegisterPair());
  absl::StatusOr<HostTensor> other = RegisterTensor(*b_, "other", kLayout, 14);
  ASSERT_TRUE(other.ok()) << other.status();
  // A whole transfer first: node-b's verdict notice opens its connections back to
  // node-a, which keep node-b a known peer there through the stop below.
  TransferResult warm = RunTransfer(
      a_->stub(), MakeRequest("warm", "big", AllBlocks(), "other", AllBlocks()));
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  absl::StatusOr<HostTensor> local = RegisterTensor(*a_, "local", kLayout, 15);
  ASSERT_TRUE(local.ok()) << local.status();
  WatchCall outgoing(a_->stub(), "big", /*outgoing=*/true, kGiveUp + absl::Seconds(30));
  ASSERT_TRUE(outgoing.established());
  TransferCall call(a_->stub(), Request("stopped-target"), kGiveUp + absl::Seconds(30));
  ASSERT_NO_FATAL_FAILURE(MoveFirstLayer(call, "stopped-target"));
  b_->Pause();
  const absl::Time stopped = absl::Now();
  ASSERT_TRUE(LayersReady(a_->stub(), "stopped-target", 2).ok());

  v1::TransferRequest in_node =
      MakeRequest("in-node-meanwhile", "big", AllBlocks(), "local", AllBlocks());
  in_node.mutable_target()->set_node(kNodeA);
  TransferResult moved = RunTransfer(a_->stub(), in_node);
  EXPECT_TRUE(moved.status.ok()) << moved.status.error_message();
  EXPECT_TRUE(std::equal(source_.buffer->span().begin(), source_.buffer->span().end(),
                         local->buffer->span().begin()))
      << "the in-node move beside the stopped target is not byte-exact";

  TransferResult result = call.Finish();
  const double stop_to_end_ms = absl::ToDoubleMilliseconds(result.ended - stopped);
  std::printf(
      "bench: target stopped, source stream ended after %.0f ms (code %d: %s; ack "
      "timeouts %.0f)\n",
      stop_to_end_ms, static_cast<int>(result.status.error_code()),
      result.status.error_message().c_str(),
      Counter(*a_, "fuselink_fabric_ack_timeouts_total"));
  EXPECT_FALSE(result.status.ok()) << "the transfer ended before the stop";
  EXPECT_LT(result.ended - stopped, kGiveUp);
  ASSERT_FALSE(result.events.empty());
  const v1::TransferEvent& last = result.events.back();
  ASSERT_TRUE(last.has_failed()) << last.DebugString();
  EXPECT_FALSE(last.failed().reason().empty()) << last.DebugString();
  // The outgoing watch saw the in-node move complete and this one fail, with the
  // stream's reason.
  ASSERT_TRUE(outgoing.WaitForEvents(2)) << outgoing.events().size() << " events";
  const std::vector<v1::WatchEvent> told = outgoing.events();
  const auto failed = std::find_if(told.begin(), told.end(),
                                   [](const v1::WatchEvent& e) { return e.code() != 0; });
  ASSERT_NE(failed, told.end()) << "no watch event of the failed transfer";
  EXPECT_EQ(failed->reason(), last.failed().reason()) << failed->DebugString();
  b_->Resume();

  // Back: the first transfer to find the failed NICs has them re-opened at once (not
  // at the next periodic repair), and one of the next completes. Into the other
  // tensor, which no slot of the failed transfer holds.
  const absl::Time thawed = absl::Now();
  int attempts = 0;
  TransferResult next;
  do {
    if (attempts > 0) absl::SleepFor(absl::Milliseconds(20));
    v1::TransferRequest again = MakeRequest(absl::StrCat("after-thaw-", ++attempts),
                                            "big", AllBlocks(), "other", AllBlocks());
    next = TransferCall(a_->stub(), again).Finish();
  } while (!next.status.ok() && absl::Now() - thawed < kGiveUp);
  std::printf("bench: target thawed, a transfer completed %.0f ms later (attempt %d)\n",
              absl::ToDoubleMilliseconds(next.ended - thawed), attempts);
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
  grpc::Status unregistered = UnregisterTensor(*a_, "big");
  EXPECT_TRUE(unregistered.ok()) << unregistered.error_message();
}

}  // namespace
}  // namespace fuselink::testing

namespace fuselink::testing {
namespace {

// The drills below end a transfer to a stopped target by its own end (a deadline, a
// cancel) with the acknowledgement bound far off, so that only the drain bound can
// fail its writes.
constexpr int kDrainMs = 1000;
std::vector<std::string> DrainFlags() {
  std::vector<std::string> flags = kFlags;
  flags.push_back("--fabric_ack_timeout_ms=600000");
  flags.push_back(absl::StrCat("--transfer_drain_timeout_ms=", kDrainMs));
  return flags;
}

// The target stops, and the acknowledgement bound is far off: the transfer's own
// deadline decides its end, and --transfer_drain_timeout_ms later its writes are
// failed by closing the connections to the target, so that its stream ends and its
// tensor is let go of. Once the target is back, the next transfer reconnects.
TEST_F(StallTest, TargetStoppedTransferEndsOneDrainBoundAfterItsDeadline) {
  ASSERT_NO_FATAL_FAILURE(StartNodes(DrainFlags(), kFlags));
  ASSERT_NO_FATAL_FAILURE(RegisterPair());
  v1::TransferRequest request = Request("drained");
  const absl::Time deadline = absl::Now() + absl::Seconds(4);
  *request.mutable_deadline() = google::protobuf::util::TimeUtil::NanosecondsToTimestamp(
      absl::ToUnixNanos(deadline));
  TransferCall call(a_->stub(), request, kGiveUp);
  ASSERT_NO_FATAL_FAILURE(MoveFirstLayer(call, "drained"));
  b_->Pause();
  ASSERT_TRUE(LayersReady(a_->stub(), "drained", 2).ok());

  TransferResult result = call.Finish();
  const double deadline_to_end_ms = absl::ToDoubleMilliseconds(result.ended - deadline);
  const double forced = Counter(*a_, "fuselink_transfer_forced_drains_total", {});
  std::printf(
      "bench: target stopped, stream ended %.0f ms after the deadline (drain bound %d "
      "ms; code %d: %s; forced drains %.0f)\n",
      deadline_to_end_ms, kDrainMs, static_cast<int>(result.status.error_code()),
      result.status.error_message().c_str(), forced);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << result.status.error_message();
  EXPECT_GE(result.ended, deadline);
  // The bound plus slack for a loaded machine: a bound, not a speed.
  EXPECT_LT(result.ended - deadline, absl::Milliseconds(kDrainMs) + absl::Seconds(10));
  EXPECT_EQ(forced, 1);
  grpc::Status unregistered = UnregisterTensor(*a_, "big");
  EXPECT_TRUE(unregistered.ok()) << unregistered.error_message();

  b_->Resume();
  absl::StatusOr<HostTensor> again = RegisterTensor(*a_, "big", kLayout, 13);
  ASSERT_TRUE(again.ok()) << again.status();
  TransferResult next =
      TransferCall(a_->stub(),
                   MakeRequest("after-drain", "big", AllBlocks(), "big", AllBlocks()))
          .Finish();
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
}

// The same with a cancel instead of a deadline: the target stops, the router cancels,
// and the writes still out are failed one drain bound later, so that the stream ends
// CANCELLED and the tensor is let go of while the target is still stopped.
TEST_F(StallTest, TargetStoppedTransferEndsOneDrainBoundAfterItsCancel) {
  ASSERT_NO_FATAL_FAILURE(StartNodes(DrainFlags(), kFlags));
  ASSERT_NO_FATAL_FAILURE(RegisterPair());
  TransferCall call(a_->stub(), Request("cancelled"), kGiveUp);
  ASSERT_NO_FATAL_FAILURE(MoveFirstLayer(call, "cancelled"));
  b_->Pause();
  ASSERT_TRUE(LayersReady(a_->stub(), "cancelled", 2).ok());

  v1::CancelTransferRequest cancel;
  cancel.set_request_id("cancelled");
  v1::TransferStatus status;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  const absl::Time cancelled_at = absl::Now();
  ASSERT_TRUE(a_->stub().CancelTransfer(&context, cancel, &status).ok());
  TransferResult result = call.Finish();
  const double cancel_to_end_ms = absl::ToDoubleMilliseconds(result.ended - cancelled_at);
  std::printf(
      "bench: target stopped, stream ended %.0f ms after the cancel (drain bound %d ms; "
      "code %d: %s)\n",
      cancel_to_end_ms, kDrainMs, static_cast<int>(result.status.error_code()),
      result.status.error_message().c_str());
  EXPECT_TRUE(HasError(result.status, grpc::StatusCode::CANCELLED, "CANCELLED"));
  // The bound plus slack for a loaded machine: a bound, not a speed.
  EXPECT_LT(result.ended - cancelled_at,
            absl::Milliseconds(kDrainMs) + absl::Seconds(10));
  EXPECT_EQ(Counter(*a_, "fuselink_transfer_forced_drains_total", {}), 1);
  grpc::Status unregistered = UnregisterTensor(*a_, "big");
  EXPECT_TRUE(unregistered.ok()) << unregistered.error_message();
  b_->Resume();
}

}  // namespace
}  // namespace fuselink::testing
