// Every bad TransferKVCache request, each with its code and reason: the call ends
// with the error and no events, and both agents go on moving good requests. Then the
// same for what one agent sends another (Peer.Hello, Peer.PrepareIncoming).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/plan.h"
#include "fuselink/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"

namespace fuselink::testing {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint32_t kBlocks = 32;
constexpr uint64_t kBlockBytes = 16 << 10;

class RequestErrorTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartNodes());
    const v1::Layout layout = MakeLayout(kLayers, kBlocks, kBlockBytes);
    for (auto [agent, name, l] :
         {std::tuple{a_.get(), "kv", layout}, std::tuple{b_.get(), "kv", layout},
          std::tuple{b_.get(), "kv-wide", MakeLayout(kLayers, kBlocks, 2 * kBlockBytes)},
          std::tuple{b_.get(), "kv-short", MakeLayout(2, kBlocks, kBlockBytes)}}) {
      absl::StatusOr<HostTensor> t = RegisterTensor(*agent, name, l, tensors_.size());
      ASSERT_TRUE(t.ok()) << t.status();
      tensors_.push_back(*std::move(t));
    }
  }

  void TearDown() override {
    if (a_ == nullptr || b_ == nullptr) return TwoNodeTest::TearDown();
    // Neither agent is hurt: both serve, and a good request still moves its bytes.
    EXPECT_TRUE(Serves(*a_));
    EXPECT_TRUE(Serves(*b_));
    TransferResult good = RunTransfer(
        a_->stub(),
        MakeRequest(absl::StrCat("good-", ++good_requests_), "kv", {0, 1}, "kv", {2, 3}));
    EXPECT_TRUE(good.status.ok()) << good.status.error_message();
    EXPECT_TRUE(!good.events.empty() && good.events.back().has_completed());
    TwoNodeTest::TearDown();
  }

  // Runs `request` and expects it refused with `code` and `reason`, with no events.
  void ExpectRefused(const v1::TransferRequest& request, grpc::StatusCode code,
                     const std::string& reason) {
    TransferResult result = RunTransfer(a_->stub(), request);
    EXPECT_TRUE(HasError(result.status, code, reason));
    EXPECT_TRUE(result.events.empty()) << result.events.front().DebugString();
  }

  std::vector<HostTensor> tensors_;
  int good_requests_ = 0;
};

TEST_F(RequestErrorTest, UnknownSourceTensor) {
  ExpectRefused(MakeRequest("r", "no-such", {0}, "kv", {0}), grpc::StatusCode::NOT_FOUND,
                "UNKNOWN_TENSOR");
}

TEST_F(RequestErrorTest, UnknownTargetTensor) {
  ExpectRefused(MakeRequest("r", "kv", {0}, "no-such", {0}), grpc::StatusCode::NOT_FOUND,
                "UNKNOWN_TENSOR");
}

TEST_F(RequestErrorTest, UnknownTargetNode) {
  v1::TransferRequest request = MakeRequest("r", "kv", {0}, "kv", {0});
  request.mutable_target()->set_node("node-z");
  ExpectRefused(request, grpc::StatusCode::NOT_FOUND, "UNKNOWN_NODE");
}

TEST_F(RequestErrorTest, UnknownSourceNode) {
  v1::TransferRequest request = MakeRequest("r", "kv", {0}, "kv", {0});
  request.mutable_source()->set_node("node-z");
  ExpectRefused(request, grpc::StatusCode::NOT_FOUND, "UNKNOWN_NODE");
}

TEST_F(RequestErrorTest, SourceOnAnotherNode) {
  v1::TransferRequest request = MakeRequest("r", "kv", {0}, "kv", {0});
  request.mutable_source()->set_node(kNodeB);
  ExpectRefused(request, grpc::StatusCode::FAILED_PRECONDITION, "SOURCE_NOT_LOCAL");
}

// Past the per-request bound (about 1 MiB of block ids on each side, still a
// message gRPC accepts).
TEST_F(RequestErrorTest, TooManyBlocks) {
  const std::vector<uint32_t> ids(transfer::kMaxBlocksPerRequest + 1, 0);
  ExpectRefused(MakeRequest("r", "kv", ids, "kv", ids),
                grpc::StatusCode::INVALID_ARGUMENT, "TOO_MANY_BLOCKS");
}

TEST_F(RequestErrorTest, TargetOnTheSourceNode) {
  v1::TransferRequest request = MakeRequest("r", "kv", {0}, "kv", {1});
  request.mutable_target()->set_node(kNodeA);
  ExpectRefused(request, grpc::StatusCode::UNIMPLEMENTED, "LOCAL_TARGET");
}

TEST_F(RequestErrorTest, SourceBlockOutsideTheTensor) {
  ExpectRefused(MakeRequest("r", "kv", {0, kBlocks}, "kv", {0, 1}),
                grpc::StatusCode::OUT_OF_RANGE, "BLOCK_OUT_OF_RANGE");
}

TEST_F(RequestErrorTest, TargetBlockOutsideTheTensor) {
  ExpectRefused(MakeRequest("r", "kv", {0, 1}, "kv", {0, kBlocks + 7}),
                grpc::StatusCode::OUT_OF_RANGE, "BLOCK_OUT_OF_RANGE");
}

TEST_F(RequestErrorTest, LayerRangeOutsideTheSource) {
  v1::TransferRequest request = MakeRequest("r", "kv", {0}, "kv", {0});
  request.mutable_layers()->set_begin(2);
  request.mutable_layers()->set_end(kLayers + 1);
  ExpectRefused(request, grpc::StatusCode::OUT_OF_RANGE, "LAYER_OUT_OF_RANGE");
}

TEST_F(RequestErrorTest, EmptyLayerRange) {
  v1::TransferRequest request = MakeRequest("r", "kv", {0}, "kv", {0});
  request.mutable_layers()->set_begin(2);
  request.mutable_layers()->set_end(2);
  ExpectRefused(request, grpc::StatusCode::OUT_OF_RANGE, "LAYER_OUT_OF_RANGE");
}

TEST_F(RequestErrorTest, LayerRangeOutsideTheTarget) {
  // Fits the source's 4 layers, not the target's 2.
  v1::TransferRequest request = MakeRequest("r", "kv", {0}, "kv-short", {0});
  request.mutable_layers()->set_begin(1);
  request.mutable_layers()->set_end(3);
  ExpectRefused(request, grpc::StatusCode::OUT_OF_RANGE, "LAYER_OUT_OF_RANGE");
}

TEST_F(RequestErrorTest, BlockCountsDiffer) {
  ExpectRefused(MakeRequest("r", "kv", {0, 1, 2}, "kv", {0, 1}),
                grpc::StatusCode::INVALID_ARGUMENT, "BLOCK_COUNT_MISMATCH");
}

TEST_F(RequestErrorTest, BlockSizesDiffer) {
  ExpectRefused(MakeRequest("r", "kv", {0, 1}, "kv-wide", {0, 1}),
                grpc::StatusCode::INVALID_ARGUMENT, "BLOCK_SIZE_MISMATCH");
}

TEST_F(RequestErrorTest, TargetBlockListedTwice) {
  ExpectRefused(MakeRequest("r", "kv", {0, 1, 2}, "kv", {5, 6, 5}),
                grpc::StatusCode::INVALID_ARGUMENT, "DUPLICATE_TARGET_BLOCK");
}

TEST_F(RequestErrorTest, EmptyRequest) {
  ExpectRefused(MakeRequest("r", "kv", {}, "kv", {}), grpc::StatusCode::INVALID_ARGUMENT,
                "EMPTY_REQUEST");
}

TEST_F(RequestErrorTest, MissingOrOverlongRequestId) {
  ExpectRefused(MakeRequest("", "kv", {0}, "kv", {0}), grpc::StatusCode::INVALID_ARGUMENT,
                "BAD_REQUEST_ID");
  ExpectRefused(MakeRequest(std::string(129, 'r'), "kv", {0}, "kv", {0}),
                grpc::StatusCode::INVALID_ARGUMENT, "BAD_REQUEST_ID");
}

TEST_F(RequestErrorTest, RefusedRequestIdMayBeUsedAgain) {
  // A request the target refused never started: its id is free for a fixed request.
  ExpectRefused(MakeRequest("retry-me", "kv", {0}, "no-such", {0}),
                grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR");
  TransferResult fixed =
      RunTransfer(a_->stub(), MakeRequest("retry-me", "kv", {0}, "kv", {0}));
  EXPECT_TRUE(fixed.status.ok()) << fixed.status.error_message();
}

// The agent-to-agent service checks what a peer sends as carefully: a bad Hello or
// PrepareIncoming gets its code and reason, and nothing is reserved.
class PeerRequestTest : public RequestErrorTest {
 protected:
  grpc::Status Prepare(const v1::PrepareIncomingRequest& request) {
    auto stub = v1::Peer::NewStub(
        grpc::CreateChannel(b_->grpc_address(), grpc::InsecureChannelCredentials()));
    v1::PrepareIncomingResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return stub->PrepareIncoming(&context, request, &response);
  }

  v1::PrepareIncomingRequest Good() {
    v1::PrepareIncomingRequest request;
    request.set_source_node("node-a");
    request.set_transfer_id("raw-1");
    request.set_tensor("kv");
    request.add_block_ids(0);
    request.set_layer_begin(0);
    request.set_layer_end(kLayers);
    request.set_block_bytes(kBlockBytes);
    request.set_total_bytes(kLayers * kBlockBytes);
    return request;
  }
};

TEST_F(PeerRequestTest, HelloOfAnotherVersion) {
  auto stub = v1::Peer::NewStub(
      grpc::CreateChannel(b_->grpc_address(), grpc::InsecureChannelCredentials()));
  v1::HelloRequest request;
  request.set_version(2);
  v1::HelloResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  EXPECT_TRUE(HasError(stub->Hello(&context, request, &response),
                       grpc::StatusCode::FAILED_PRECONDITION, "VERSION_MISMATCH"));
}

TEST_F(PeerRequestTest, PrepareIncomingChecksEveryField) {
  v1::PrepareIncomingRequest r = Good();
  r.set_source_nic(99);
  EXPECT_TRUE(HasError(Prepare(r), grpc::StatusCode::INVALID_ARGUMENT, "BAD_SOURCE_NIC"));
  r = Good();
  r.set_total_bytes(r.total_bytes() + 1);
  EXPECT_TRUE(HasError(Prepare(r), grpc::StatusCode::INVALID_ARGUMENT, "BAD_TOTAL"));
  r = Good();
  r.set_tensor("no-such");
  EXPECT_TRUE(HasError(Prepare(r), grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  r = Good();
  r.set_block_bytes(kBlockBytes / 2);
  EXPECT_TRUE(
      HasError(Prepare(r), grpc::StatusCode::INVALID_ARGUMENT, "BLOCK_SIZE_MISMATCH"));
  // TearDown then checks that both agents still serve and move a good transfer.
}

// Every incoming slot taken: the next transfer is refused, and the target serves on.
// (Its own fixture: the slots stay reserved until they expire, so no good transfer
// can follow as RequestErrorTest checks after each test.)
TEST_F(TwoNodeTest, PrepareIncomingPastEverySlot) {
  ASSERT_NO_FATAL_FAILURE(StartNodes());
  absl::StatusOr<HostTensor> kv =
      RegisterTensor(*b_, "kv", MakeLayout(kLayers, kBlocks, kBlockBytes), 0);
  ASSERT_TRUE(kv.ok()) << kv.status();
  auto stub = v1::Peer::NewStub(
      grpc::CreateChannel(b_->grpc_address(), grpc::InsecureChannelCredentials()));
  v1::PrepareIncomingRequest r;
  r.set_source_node("node-a");
  r.set_tensor("kv");
  r.add_block_ids(0);
  r.set_layer_end(kLayers);
  r.set_block_bytes(kBlockBytes);
  r.set_total_bytes(kLayers * kBlockBytes);
  auto prepare = [&](const std::string& id) {
    r.set_transfer_id(id);
    v1::PrepareIncomingResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return stub->PrepareIncoming(&context, r, &response);
  };
  for (uint32_t i = 0; i < transfer::kMaxIncoming; ++i) {
    ASSERT_TRUE(prepare(absl::StrCat("slot-", i)).ok()) << i;
  }
  EXPECT_TRUE(HasError(prepare("one-too-many"), grpc::StatusCode::RESOURCE_EXHAUSTED,
                       "TOO_MANY_INCOMING"));
  EXPECT_TRUE(Serves(*b_));
}

}  // namespace
}  // namespace fuselink::testing
