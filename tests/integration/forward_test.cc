// Any agent can be asked: a TransferKVCache sent to the target's agent (the decode side
// pulling) is forwarded to the source's agent over the peer channel and its events
// streamed back. The bytes, the stream, idempotency across the forward, the source's
// errors with their reasons, and a source that cannot be reached.
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"

namespace fuselink::testing {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint32_t kBlocks = 32;
constexpr uint64_t kBlockBytes = 64 << 10;

class ForwardTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    // node-a, the source, runs what node-b forwards.
    ASSERT_NO_FATAL_FAILURE(StartMutualNodes({"--accept_forwarded"}));
    const v1::Layout layout = MakeLayout(kLayers, kBlocks, kBlockBytes);
    absl::StatusOr<HostTensor> source = RegisterTensor(*a_, "kv", layout, 1);
    ASSERT_TRUE(source.ok()) << source.status();
    source_ = *std::move(source);
    absl::StatusOr<HostTensor> target = RegisterTensor(*b_, "kv", layout, 2);
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
  }

  HostTensor source_;
  HostTensor target_;
};

TEST_F(ForwardTest, TheTargetsAgentPullsFromTheSource) {
  std::vector<uint8_t> expected = Snapshot(target_);
  WatchCall outgoing(a_->stub(), "kv", /*outgoing=*/true);
  ASSERT_TRUE(outgoing.established());
  const std::vector<uint32_t> source_ids = {3, 7, 8, 9, 20};
  const std::vector<uint32_t> target_ids = {30, 1, 10, 11, 4};
  // Asked of node-b, whose tensor is the target; node-a's is the source.
  TransferResult pulled =
      RunTransfer(b_->stub(), MakeRequest("pull", "kv", source_ids, "kv", target_ids));
  ASSERT_TRUE(pulled.status.ok()) << pulled.status.error_message();
  ASSERT_GE(pulled.events.size(), 2u);
  const v1::TransferEvent& first = pulled.events.front();
  ASSERT_TRUE(first.has_accepted()) << first.DebugString();
  EXPECT_EQ(first.accepted().transport(), "tcp");
  const v1::TransferEvent& last = pulled.events.back();
  ASSERT_TRUE(last.has_completed()) << last.DebugString();
  EXPECT_EQ(last.completed().total_bytes(), source_ids.size() * kLayers * kBlockBytes);
  // The source's transfer: node-a named it and moved it.
  EXPECT_TRUE(absl::StartsWith(last.transfer_id(), "node-a-")) << last.transfer_id();
  expected = Expected(source_, target_, expected, source_ids, target_ids, 0, kLayers);
  EXPECT_TRUE(Holds(target_, expected));
  ASSERT_TRUE(outgoing.WaitForEvents(1));
  EXPECT_EQ(outgoing.events()[0].transfer_id(), last.transfer_id());
  EXPECT_EQ(outgoing.events()[0].target_node(), kNodeB);

  // The source's agent knows it as its own: found there by its request id.
  v1::GetTransferRequest get;
  get.set_request_id("pull");
  v1::TransferStatus status;
  grpc::ClientContext context;
  ASSERT_TRUE(a_->stub().GetTransfer(&context, get, &status).ok());
  EXPECT_EQ(status.transfer_id(), last.transfer_id());
  EXPECT_EQ(status.state(), v1::TRANSFER_STATE_COMPLETED);
}

TEST_F(ForwardTest, ARequestIdNamesOneTransferWhicheverAgentIsAsked) {
  const v1::TransferRequest request = MakeRequest("once", "kv", {1, 2}, "kv", {5, 6});
  TransferResult direct = RunTransfer(a_->stub(), request);
  ASSERT_TRUE(direct.status.ok()) << direct.status.error_message();
  // The same request through node-b attaches to the transfer node-a ran.
  TransferResult again = RunTransfer(b_->stub(), request);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  ASSERT_FALSE(again.events.empty());
  EXPECT_EQ(again.events.back().transfer_id(), direct.events.back().transfer_id());
  EXPECT_TRUE(again.events.back().has_completed());
  // Other content under the same id, through node-b: refused at the source.
  TransferResult other =
      RunTransfer(b_->stub(), MakeRequest("once", "kv", {1, 3}, "kv", {5, 6}));
  EXPECT_TRUE(
      HasError(other.status, grpc::StatusCode::ALREADY_EXISTS, "REQUEST_ID_REUSED"));
  EXPECT_NE(other.status.error_message().find("'once'"), std::string::npos)
      << other.status.error_message();
  EXPECT_TRUE(other.events.empty());
}

TEST_F(ForwardTest, TheSourcesErrorsComeBackWithTheirReasons) {
  struct Case {
    v1::TransferRequest request;
    grpc::StatusCode code;
    const char* reason;
  };
  const Case cases[] = {
      {MakeRequest("r1", "no-such", {0}, "kv", {0}), grpc::StatusCode::NOT_FOUND,
       "UNKNOWN_TENSOR"},
      {MakeRequest("r2", "kv", {0, kBlocks}, "kv", {0, 1}),
       grpc::StatusCode::OUT_OF_RANGE, "BLOCK_OUT_OF_RANGE"},
      {MakeRequest("r3", "kv", {0}, "no-such", {0}), grpc::StatusCode::NOT_FOUND,
       "UNKNOWN_TENSOR"},  // node-b's own answer to node-a's PrepareIncoming
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.request.request_id());
    TransferResult result = RunTransfer(b_->stub(), c.request);
    EXPECT_TRUE(HasError(result.status, c.code, c.reason));
    EXPECT_TRUE(result.events.empty());
  }
  EXPECT_TRUE(Serves(*a_));
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(ForwardTest, ASourceThatCannotBeReachedIsUnavailable) {
  a_->Kill();
  TransferResult result =
      RunTransfer(b_->stub(), MakeRequest("lost", "kv", {0}, "kv", {0}));
  EXPECT_TRUE(HasError(result.status, grpc::StatusCode::UNAVAILABLE, "PEER_UNREACHABLE"));
  EXPECT_TRUE(Serves(*b_));
  a_.reset();
}

}  // namespace
}  // namespace fuselink::testing
