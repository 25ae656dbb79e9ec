// Any agent can be asked: a TransferKVCache sent to the target's agent (the decode side
// pulling) is forwarded to the source's agent over the peer channel and its events
// streamed back. The bytes, the stream, idempotency across the forward, the source's
// errors with their reasons, and a source that cannot be reached. The calls a router
// makes on a running transfer (GetTransfer, LayersReady, ExtendLease, CancelTransfer)
// are forwarded the same way when they name the source's node.
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

  // One of the four calls on a transfer, asked of `agent`.
  template <typename Request>
  grpc::Status Control(AgentProcess& agent,
                       grpc::Status (v1::Agent::Stub::*rpc)(grpc::ClientContext*,
                                                            const Request&,
                                                            v1::TransferStatus*),
                       Request request, v1::TransferStatus* status = nullptr) {
    v1::TransferStatus ignored;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    return (agent.stub().*rpc)(&context, request, status ? status : &ignored);
  }
  template <typename Request>
  static Request Naming(const std::string& request_id, const std::string& source) {
    Request r;
    r.set_request_id(request_id);
    r.set_source_node(source);
    return r;
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

// A peer's answer crosses each agent led by the node that gave it: the source's own
// error through node-b, and node-b's answer to node-a's PrepareIncoming (node-b as the
// target) back through node-a and node-b again. Code and reason stay the peer's.
TEST_F(ForwardTest, ErrorsSayWhichNodeGaveThem) {
  TransferResult source =
      RunTransfer(b_->stub(), MakeRequest("w1", "no-such", {0}, "kv", {0}));
  EXPECT_TRUE(HasError(source.status, grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  EXPECT_TRUE(absl::StartsWith(source.status.error_message(),
                               "node 'node-a': no tensor named 'no-such'"))
      << source.status.error_message();
  TransferResult target =
      RunTransfer(b_->stub(), MakeRequest("w2", "kv", {0}, "no-such", {0}));
  EXPECT_TRUE(HasError(target.status, grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  EXPECT_TRUE(absl::StartsWith(target.status.error_message(),
                               "node 'node-a': node 'node-b': no tensor named 'no-such'"))
      << target.status.error_message();
}

// A pull the router follows and drives through the target's agent alone: the status,
// each layer as it is ready, a renewed lease, and the source's own errors.
TEST_F(ForwardTest, TheRouterDrivesAPulledTransferThroughTheTargetsAgent) {
  std::vector<uint8_t> expected = Snapshot(target_);
  const std::vector<uint32_t> ids = {2, 5};
  v1::TransferRequest request = MakeRequest("lbl", "kv", ids, "kv", ids);
  request.set_layer_by_layer(true);
  request.set_lease_ms(5000);
  TransferCall pull(b_->stub(), request);
  ASSERT_TRUE(
      pull.WaitForEvent([](const v1::TransferEvent& e) { return e.has_accepted(); }));

  using Stub = v1::Agent::Stub;
  v1::TransferStatus status;
  ASSERT_TRUE(Control(*b_, &Stub::GetTransfer,
                      Naming<v1::GetTransferRequest>("lbl", kNodeA), &status)
                  .ok());
  EXPECT_EQ(status.state(), v1::TRANSFER_STATE_RUNNING);
  EXPECT_TRUE(absl::StartsWith(status.transfer_id(), "node-a-")) << status.transfer_id();
  EXPECT_TRUE(
      Control(*b_, &Stub::ExtendLease, Naming<v1::ExtendLeaseRequest>("lbl", kNodeA))
          .ok());
  auto ready = Naming<v1::LayersReadyRequest>("lbl", kNodeA);
  ready.set_ready_end(2);
  ASSERT_TRUE(Control(*b_, &Stub::LayersReady, ready).ok());
  ASSERT_TRUE(pull.WaitForEvent([](const v1::TransferEvent& e) {
    return e.has_layer_done() && e.layer_done().layer() == 1;
  }));
  // Not a layer the transfer has: the source's error, its reason intact.
  ready.set_ready_end(kLayers + 1);
  EXPECT_TRUE(HasError(Control(*b_, &Stub::LayersReady, ready),
                       grpc::StatusCode::OUT_OF_RANGE, "LAYER_OUT_OF_RANGE"));
  ready.set_ready_end(kLayers);
  ASSERT_TRUE(Control(*b_, &Stub::LayersReady, ready).ok());
  TransferResult done = pull.Finish();
  ASSERT_TRUE(done.status.ok()) << done.status.error_message();
  EXPECT_TRUE(done.events.back().has_completed());
  expected = Expected(source_, target_, expected, ids, ids, 0, kLayers);
  EXPECT_TRUE(Holds(target_, expected));

  ASSERT_TRUE(Control(*b_, &Stub::GetTransfer,
                      Naming<v1::GetTransferRequest>("lbl", kNodeA), &status)
                  .ok());
  EXPECT_EQ(status.state(), v1::TRANSFER_STATE_COMPLETED);
  EXPECT_EQ(status.transfer_id(), done.events.back().transfer_id());
  EXPECT_TRUE(HasError(Control(*b_, &Stub::CancelTransfer,
                               Naming<v1::CancelTransferRequest>("lbl", kNodeA)),
                       grpc::StatusCode::FAILED_PRECONDITION, "TRANSFER_FINISHED"));
  // Without source_node the target's agent looks among its own transfers: none.
  EXPECT_TRUE(HasError(
      Control(*b_, &Stub::GetTransfer, Naming<v1::GetTransferRequest>("lbl", "")),
      grpc::StatusCode::NOT_FOUND, "UNKNOWN_TRANSFER"));
}

TEST_F(ForwardTest, ACancelSentToTheTargetsAgentEndsThePull) {
  v1::TransferRequest request = MakeRequest("stop-me", "kv", {1}, "kv", {1});
  request.set_layer_by_layer(true);  // nothing is sent until told: it waits
  TransferCall pull(b_->stub(), request);
  ASSERT_TRUE(
      pull.WaitForEvent([](const v1::TransferEvent& e) { return e.has_accepted(); }));
  ASSERT_TRUE(Control(*b_, &v1::Agent::Stub::CancelTransfer,
                      Naming<v1::CancelTransferRequest>("stop-me", kNodeA))
                  .ok());
  TransferResult ended = pull.Finish();
  EXPECT_TRUE(HasError(ended.status, grpc::StatusCode::CANCELLED, "CANCELLED"));
  v1::TransferStatus status;
  ASSERT_TRUE(Control(*a_, &v1::Agent::Stub::GetTransfer,
                      Naming<v1::GetTransferRequest>("stop-me", ""), &status)
                  .ok());
  EXPECT_EQ(status.state(), v1::TRANSFER_STATE_CANCELLED);
}

TEST_F(ForwardTest, ForwardedCallsOnTransfersFailWithTheirReasons) {
  using Stub = v1::Agent::Stub;
  EXPECT_TRUE(HasError(
      Control(*b_, &Stub::GetTransfer, Naming<v1::GetTransferRequest>("x", "node-z")),
      grpc::StatusCode::NOT_FOUND, "UNKNOWN_NODE"));
  EXPECT_TRUE(HasError(
      Control(*b_, &Stub::GetTransfer, Naming<v1::GetTransferRequest>("", kNodeA)),
      grpc::StatusCode::INVALID_ARGUMENT, "MISSING_ID"));
  EXPECT_TRUE(HasError(Control(*b_, &Stub::ExtendLease,
                               Naming<v1::ExtendLeaseRequest>("never-sent", kNodeA)),
                       grpc::StatusCode::NOT_FOUND, "UNKNOWN_TRANSFER"));
  ASSERT_TRUE(
      RunTransfer(a_->stub(), MakeRequest("plain", "kv", {0}, "kv", {0})).status.ok());
  EXPECT_TRUE(HasError(
      Control(*b_, &Stub::ExtendLease, Naming<v1::ExtendLeaseRequest>("plain", kNodeA)),
      grpc::StatusCode::FAILED_PRECONDITION, "NO_LEASE"));
  auto ready = Naming<v1::LayersReadyRequest>("plain", kNodeA);
  ready.set_ready_end(1);
  EXPECT_TRUE(HasError(Control(*b_, &Stub::LayersReady, ready),
                       grpc::StatusCode::FAILED_PRECONDITION, "NOT_LAYER_BY_LAYER"));
  EXPECT_TRUE(Serves(*a_));
  EXPECT_TRUE(Serves(*b_));
  // A source that does not answer.
  a_->Kill();
  EXPECT_TRUE(HasError(
      Control(*b_, &Stub::GetTransfer, Naming<v1::GetTransferRequest>("plain", kNodeA)),
      grpc::StatusCode::UNAVAILABLE, "PEER_UNREACHABLE"));
  EXPECT_TRUE(Serves(*b_));
  a_.reset();
}

// Stopping, the target's agent ends the pulls it forwards, whose source still waits,
// and exits cleanly: they are told SHUTTING_DOWN, not left to the server's grace.
TEST_F(ForwardTest, AStoppingAgentEndsTheCallsItForwarded) {
  v1::TransferRequest request = MakeRequest("waits", "kv", {1}, "kv", {1});
  request.set_layer_by_layer(true);  // the source sends nothing until told
  TransferCall pull(b_->stub(), request);
  ASSERT_TRUE(
      pull.WaitForEvent([](const v1::TransferEvent& e) { return e.has_accepted(); }));
  b_->Terminate();
  TransferResult ended = pull.Finish();
  EXPECT_TRUE(HasError(ended.status, grpc::StatusCode::UNAVAILABLE, "SHUTTING_DOWN"))
      << ended.status.error_message();
  EXPECT_TRUE(b_->Stop().ok());
  b_.reset();
  EXPECT_TRUE(Serves(*a_));
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
