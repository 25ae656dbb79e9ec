// Agents that stop dead (SIGSTOP) mid-transfer, neither closing nor answering: the
// fabric's bounds (--fabric_stall_timeout_ms, --fabric_ack_timeout_ms) and the
// landing's end what waits on them, and the tensors are let go. Times are printed as
// "bench:" lines; the waits are bounded generously and speed is not asserted.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"
#include "tools/client/scrape.h"

namespace fuselink::testing {
namespace {

// 128 MiB in 16 MiB writes, one in flight: a stop lands inside a write's payload
// far more often than between two.
const v1::Layout kLayout = MakeLayout(1, 128, 1 << 20);
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

double Counter(AgentProcess& agent, const std::string& name) {
  absl::StatusOr<std::string> metrics =
      client::HttpGet(agent.metrics_url(), kWaitTimeout);
  if (!metrics.ok()) return -1;
  absl::StatusOr<double> value = client::MetricValue(*metrics, name, {{"nic", "rail0"}});
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
    return MakeRequest(id, "big", AllBlocks(), "big", AllBlocks());
  }

  HostTensor source_;
  HostTensor target_;
};

// The source stops: the target's incoming transfer ends with a failure and a reason,
// and its tensor can be unregistered (the landing let go of it).
TEST_F(StallTest, SourceStoppedMidTransferLetsTheTargetGo) {
  ASSERT_NO_FATAL_FAILURE(StartNodes(kFlags, kFlags));
  ASSERT_NO_FATAL_FAILURE(RegisterPair());
  WatchCall watch(b_->stub(), "big");
  ASSERT_TRUE(watch.established());
  TransferCall call(a_->stub(), Request("stopped-source"));
  ASSERT_TRUE(call.WaitUntilMoving());
  a_->Pause();
  const absl::Time stopped = absl::Now();

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

// The target stops: the source's stream ends with a failure and a reason.
TEST_F(StallTest, TargetStoppedMidTransferEndsTheSourcesStream) {
  ASSERT_NO_FATAL_FAILURE(StartNodes(kFlags, kFlags));
  ASSERT_NO_FATAL_FAILURE(RegisterPair());
  TransferCall call(a_->stub(), Request("stopped-target"), kGiveUp + absl::Seconds(30));
  ASSERT_TRUE(call.WaitUntilMoving());
  b_->Pause();
  const absl::Time stopped = absl::Now();

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
  b_->Resume();
  grpc::Status unregistered = UnregisterTensor(*a_, "big");
  EXPECT_TRUE(unregistered.ok()) << unregistered.error_message();
}

}  // namespace
}  // namespace fuselink::testing
