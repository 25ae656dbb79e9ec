// Every bad TransferKVCache request, each with its code and reason: the call ends
// with the error and no events, and both agents go on moving good requests. Then the
// same for what one agent sends another (Peer.Hello, Peer.PrepareIncoming).
#include <cstdint>
#include <limits>
#include <map>
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
#include "tests/integration/pki.h"
#include "tests/integration/raw_call.h"

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

// Forwarded to node-b's agent (tests/integration/forward_test.cc), which runs no
// forwarded transfers unless told to (--accept_forwarded); its refusal comes back.
TEST_F(RequestErrorTest, SourceOnAnotherNodeIsForwardedAndRefusedByDefault) {
  v1::TransferRequest request = MakeRequest("r", "kv", {0}, "kv", {1});
  request.mutable_source()->set_node(kNodeB);
  ExpectRefused(request, grpc::StatusCode::PERMISSION_DENIED, "FORWARDING_OFF");
}

// So are the calls on such a transfer: node-b refuses to answer them for node-a.
TEST_F(RequestErrorTest, CallsOnAnotherNodesTransferAreRefusedByDefault) {
  v1::LayersReadyRequest ready;
  ready.set_request_id("r");
  ready.set_ready_end(1);
  ready.set_source_node(kNodeB);
  v1::TransferStatus status;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  EXPECT_TRUE(HasError(a_->stub().LayersReady(&context, ready, &status),
                       grpc::StatusCode::PERMISSION_DENIED, "FORWARDING_OFF"));
}

// Past the per-request bound (about 1 MiB of block ids on each side, still a
// message gRPC accepts).
TEST_F(RequestErrorTest, TooManyBlocks) {
  const std::vector<uint32_t> ids(transfer::kMaxBlocksPerRequest + 1, 0);
  ExpectRefused(MakeRequest("r", "kv", ids, "kv", ids),
                grpc::StatusCode::INVALID_ARGUMENT, "TOO_MANY_BLOCKS");
}

// An in-node move (tests/integration/in_node_test.cc) may not copy a block onto
// itself.
TEST_F(RequestErrorTest, InNodeMoveOfABlockOntoItself) {
  v1::TransferRequest request = MakeRequest("r", "kv", {0, 1}, "kv", {1, 2});
  request.mutable_target()->set_node(kNodeA);
  ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "SAME_BLOCKS");
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

// A deadline that has passed, however long ago, is refused before anything is
// reserved: no events, and the id stays free.
TEST_F(RequestErrorTest, DeadlineInThePastHoweverFar) {
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  int i = 0;
  for (auto [seconds, nanos] : {std::pair<int64_t, int32_t>{now - 1, 0},
                                {-1, 0},               // before 1970
                                {-62'135'596'800, 0},  // 0001-01-01, the earliest
                                {kMin, 0},
                                {kMin, 999'999'999}}) {
    SCOPED_TRACE(::testing::Message() << seconds << " s " << nanos << " ns");
    v1::TransferRequest request =
        MakeRequest(absl::StrCat("late-", i++), "kv", {0}, "kv", {0});
    request.mutable_deadline()->set_seconds(seconds);
    request.mutable_deadline()->set_nanos(nanos);
    ExpectRefused(request, grpc::StatusCode::DEADLINE_EXCEEDED, "DEADLINE");
    EXPECT_TRUE(Serves(*a_));
  }
  // A refused request never started: its id moves a good request.
  TransferResult again =
      RunTransfer(a_->stub(), MakeRequest("late-0", "kv", {0}, "kv", {0}));
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
}

TEST_F(RequestErrorTest, DeadlineThatIsNoTimestamp) {
  const int64_t future = absl::ToUnixSeconds(absl::Now() + absl::Hours(1));
  for (int32_t nanos : {-1, 1'000'000'000, std::numeric_limits<int32_t>::max(),
                        std::numeric_limits<int32_t>::min()}) {
    SCOPED_TRACE(nanos);
    v1::TransferRequest request = MakeRequest("bad-deadline", "kv", {0}, "kv", {0});
    request.mutable_deadline()->set_seconds(future);
    request.mutable_deadline()->set_nanos(nanos);
    ExpectRefused(request, grpc::StatusCode::INVALID_ARGUMENT, "BAD_DEADLINE");
    EXPECT_TRUE(Serves(*a_));
  }
}

// Error messages quote at most 64 bytes of what the client sent.
TEST_F(RequestErrorTest, MessagesDoNotEchoLongNames) {
  const std::string long_name(100 << 10, 'n');
  auto expect_bounded = [](const grpc::Status& status) {
    EXPECT_LE(status.error_message().size(), 200u)
        << status.error_message().substr(0, 300);
    EXPECT_NE(status.error_message().find("nnn..."), std::string::npos)
        << status.error_message().substr(0, 300);
  };
  v1::GetTensorRequest get;
  get.set_name(long_name);
  v1::Tensor tensor;
  grpc::ClientContext get_context;
  const grpc::Status got = a_->stub().GetTensor(&get_context, get, &tensor);
  EXPECT_TRUE(HasError(got, grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  expect_bounded(got);

  const grpc::Status unregistered = UnregisterTensor(*a_, long_name);
  EXPECT_TRUE(HasError(unregistered, grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  expect_bounded(unregistered);

  v1::RegisterTensorRequest reg;
  reg.set_name(long_name);
  reg.mutable_memory()->mutable_host()->set_fd_token(1);
  grpc::ClientContext reg_context;
  const grpc::Status registered = a_->stub().RegisterTensor(&reg_context, reg, &tensor);
  EXPECT_TRUE(HasError(registered, grpc::StatusCode::INVALID_ARGUMENT, "BAD_NAME"));
  expect_bounded(registered);

  TransferResult transfer =
      RunTransfer(a_->stub(), MakeRequest("long-name", long_name, {0}, "kv", {0}));
  EXPECT_TRUE(HasError(transfer.status, grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  expect_bounded(transfer.status);
  EXPECT_TRUE(Serves(*a_));
}

// Bytes that are not UTF-8 in a string field: INVALID_ARGUMENT (BAD_UTF8) naming the
// field, for every method and every string field a client sends, where protobuf's
// own refusal would end the call UNIMPLEMENTED with no reason.
class Utf8Test : public RequestErrorTest {
 protected:
  static constexpr char kMarker[] = "@@@@";
  static constexpr char kNotUtf8[] = "\xc0\x80\xff\xfe";

  // Sends `message`, whose field `field` holds kMarker, with kMarker's bytes
  // replaced by kNotUtf8, to `method`; expects the refusal, and the agent serving.
  void ExpectBadUtf8(const std::string& method, const google::protobuf::Message& message,
                     const std::string& field) {
    SCOPED_TRACE(method + " " + field);
    const std::string bytes =
        Replace(message.SerializeAsString(), kMarker, absl::string_view(kNotUtf8, 4));
    ASSERT_FALSE(bytes.empty());
    RawResult result = RawCall(a_->grpc_address(), "/fuselink.v1.Agent/" + method, bytes);
    EXPECT_TRUE(HasError(result.status, grpc::StatusCode::INVALID_ARGUMENT, "BAD_UTF8"));
    EXPECT_NE(result.status.error_message().find(field), std::string::npos)
        << result.status.error_message();
    EXPECT_TRUE(result.responses.empty());
    EXPECT_TRUE(Serves(*a_));
  }
};

TEST_F(Utf8Test, InATransferRequest) {
  const std::string at = kMarker;
  auto request = [](const std::string& id, const std::string& source_node,
                    const std::string& source, const std::string& target_node,
                    const std::string& target) {
    v1::TransferRequest r = MakeRequest(id, source, {0}, target, {0});
    r.mutable_source()->set_node(source_node);
    r.mutable_target()->set_node(target_node);
    return r;
  };
  ExpectBadUtf8("TransferKVCache", request("r" + at, kNodeA, "kv", kNodeB, "kv"),
                "fuselink.v1.TransferRequest.request_id");
  ExpectBadUtf8("TransferKVCache", request("r", "node" + at, "kv", kNodeB, "kv"),
                "fuselink.v1.BlockSet.node");
  ExpectBadUtf8("TransferKVCache", request("r", kNodeA, "kv" + at, kNodeB, "kv"),
                "fuselink.v1.BlockSet.tensor");
  ExpectBadUtf8("TransferKVCache", request("r", kNodeA, "kv", "node" + at, "kv"),
                "fuselink.v1.BlockSet.node");
  ExpectBadUtf8("TransferKVCache", request("r", kNodeA, "kv", kNodeB, "kv" + at),
                "fuselink.v1.BlockSet.tensor");
}

TEST_F(Utf8Test, InEveryOtherRequest) {
  const std::string at = kMarker;
  v1::RegisterTensorRequest reg;
  reg.set_name("kv" + at);
  reg.mutable_memory()->mutable_host()->set_fd_token(1);
  ExpectBadUtf8("RegisterTensor", reg, "fuselink.v1.RegisterTensorRequest.name");
  v1::UnregisterTensorRequest unreg;
  unreg.set_name("kv" + at);
  ExpectBadUtf8("UnregisterTensor", unreg, "fuselink.v1.UnregisterTensorRequest.name");
  v1::GetTensorRequest get;
  get.set_name("kv" + at);
  ExpectBadUtf8("GetTensor", get, "fuselink.v1.GetTensorRequest.name");
  v1::ListTensorsRequest list;
  list.set_page_token("kv" + at);
  ExpectBadUtf8("ListTensors", list, "fuselink.v1.ListTensorsRequest.page_token");
  for (const std::string method : {"GetTransfer", "CancelTransfer"}) {
    v1::GetTransferRequest by_transfer;  // CancelTransferRequest has the same fields
    by_transfer.set_transfer_id("t" + at);
    ExpectBadUtf8(method, by_transfer,
                  method == "GetTransfer"
                      ? "fuselink.v1.GetTransferRequest.transfer_id"
                      : "fuselink.v1.CancelTransferRequest.transfer_id");
    v1::GetTransferRequest by_request;
    by_request.set_request_id("r" + at);
    ExpectBadUtf8(method, by_request,
                  method == "GetTransfer"
                      ? "fuselink.v1.GetTransferRequest.request_id"
                      : "fuselink.v1.CancelTransferRequest.request_id");
  }
  v1::WatchTransfersRequest watch;
  watch.set_tensor("kv" + at);
  ExpectBadUtf8("WatchTransfers", watch, "fuselink.v1.WatchTransfersRequest.tensor");
}

// The same path with the marker left in place: the bytes are UTF-8, so the request
// goes on to the handler, which answers as it always did.
TEST_F(Utf8Test, GoodBytesOnTheSamePathReachTheHandler) {
  v1::GetTensorRequest get;
  get.set_name("kv");
  RawResult found = RawCall(a_->grpc_address(), "/fuselink.v1.Agent/GetTensor",
                            get.SerializeAsString());
  ASSERT_TRUE(found.status.ok()) << found.status.error_message();
  ASSERT_EQ(found.responses.size(), 1u);
  v1::Tensor tensor;
  ASSERT_TRUE(tensor.ParseFromString(found.responses[0]));
  EXPECT_EQ(tensor.name(), "kv");
  get.set_name(std::string("kv") + kMarker);
  RawResult missing = RawCall(a_->grpc_address(), "/fuselink.v1.Agent/GetTensor",
                              get.SerializeAsString());
  EXPECT_TRUE(HasError(missing.status, grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
}

TEST_F(Utf8Test, BytesThatAreNoMessage) {
  for (const std::string method : {"GetTensor", "TransferKVCache", "GetTopology"}) {
    SCOPED_TRACE(method);
    RawResult result =
        RawCall(a_->grpc_address(), "/fuselink.v1.Agent/" + method, "\xff\xff\xff");
    EXPECT_TRUE(
        HasError(result.status, grpc::StatusCode::INVALID_ARGUMENT, "MALFORMED_REQUEST"));
    EXPECT_TRUE(result.responses.empty());
    EXPECT_TRUE(Serves(*a_));
  }
}

// The agent-to-agent service checks what a peer sends as carefully: a bad Hello or
// PrepareIncoming gets its code and reason, and nothing is reserved.
class PeerRequestTest : public RequestErrorTest {
 protected:
  grpc::Status Prepare(const v1::PrepareIncomingRequest& request) {
    auto stub = v1::Peer::NewStub(ClientChannel(b_->grpc_address(), "node", "node-a"));
    v1::PrepareIncomingResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return stub->PrepareIncoming(&context, request, &response);
  }

  v1::PrepareIncomingRequest Good() {
    v1::PrepareIncomingRequest request;
    request.set_source_node("node-a");
    request.set_requester("spiffe://fuselink/test/client");
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
  auto stub = v1::Peer::NewStub(ClientChannel(b_->grpc_address(), "node", "node-c"));
  v1::HelloRequest request;
  request.set_version(1);
  request.mutable_topology()->set_node("node-c");
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

// One peer asks for every incoming slot the target has: it gets its share and no more
// (RESOURCE_EXHAUSTED, SOURCE_SHARE), and another peer's transfer still gets a slot.
// (Its own fixture: the slots stay reserved until they expire, so no good transfer
// can follow as RequestErrorTest checks after each test.)
TEST_F(TwoNodeTest, OnePeerGetsOnlyItsShareOfIncomingSlots) {
  constexpr uint32_t kShare = 64;
  ASSERT_NO_FATAL_FAILURE(StartNodes({}, {absl::StrCat("--incoming_per_source=", kShare),
                                          "--incoming_start_timeout_ms=600000"}));
  absl::StatusOr<HostTensor> kv =
      RegisterTensor(*b_, "kv", MakeLayout(kLayers, kBlocks, kBlockBytes), 0);
  ASSERT_TRUE(kv.ok()) << kv.status();
  // One channel per peer, as an agent keeps it.
  std::map<std::string, std::unique_ptr<v1::Peer::Stub>> stubs;
  auto prepare = [&](const std::string& source, const std::string& id) {
    std::unique_ptr<v1::Peer::Stub>& stub = stubs[source];
    if (stub == nullptr) {
      stub = v1::Peer::NewStub(ClientChannel(b_->grpc_address(), "node", source));
    }
    v1::PrepareIncomingRequest r;
    r.set_source_node(source);
    r.set_requester("spiffe://fuselink/test/client");
    r.set_tensor("kv");
    r.add_block_ids(0);
    r.set_layer_end(kLayers);
    r.set_block_bytes(kBlockBytes);
    r.set_total_bytes(kLayers * kBlockBytes);
    r.set_transfer_id(id);
    v1::PrepareIncomingResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return stub->PrepareIncoming(&context, r, &response);
  };
  uint32_t granted = 0, refused = 0;
  for (uint32_t i = 0; i < transfer::kMaxIncoming; ++i) {
    grpc::Status s = prepare("node-x", absl::StrCat("slot-", i));
    if (s.ok()) {
      ++granted;
    } else {
      ASSERT_TRUE(HasError(s, grpc::StatusCode::RESOURCE_EXHAUSTED, "SOURCE_SHARE")) << i;
      ++refused;
    }
  }
  EXPECT_EQ(granted, kShare);
  EXPECT_EQ(refused, transfer::kMaxIncoming - kShare);
  EXPECT_TRUE(prepare("node-y", "other-peer").ok());
  EXPECT_TRUE(Serves(*b_));
}

// A transfer prepared and never started lets go of its slot and its tensor quickly:
// the tensor can be unregistered once the slot expired.
TEST_F(TwoNodeTest, PreparedTransferThatNeverStartsExpires) {
  ASSERT_NO_FATAL_FAILURE(StartNodes({}, {"--incoming_start_timeout_ms=300"}));
  absl::StatusOr<HostTensor> kv =
      RegisterTensor(*b_, "kv", MakeLayout(kLayers, kBlocks, kBlockBytes), 0);
  ASSERT_TRUE(kv.ok()) << kv.status();
  auto peer = v1::Peer::NewStub(ClientChannel(b_->grpc_address(), "node", "node-x"));
  v1::PrepareIncomingRequest r;
  r.set_source_node("node-x");
  r.set_requester("spiffe://fuselink/test/client");
  r.set_transfer_id("never-starts");
  r.set_tensor("kv");
  r.add_block_ids(0);
  r.set_layer_end(kLayers);
  r.set_block_bytes(kBlockBytes);
  r.set_total_bytes(kLayers * kBlockBytes);
  {
    v1::PrepareIncomingResponse response;
    grpc::ClientContext context;
    ASSERT_TRUE(peer->PrepareIncoming(&context, r, &response).ok());
  }
  {  // pinned: the tensor cannot go
    v1::UnregisterTensorRequest request;
    request.set_name("kv");
    v1::UnregisterTensorResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(HasError(b_->stub().UnregisterTensor(&context, request, &response),
                         grpc::StatusCode::FAILED_PRECONDITION, "TENSOR_IN_USE"));
  }
  v1::IncomingState state;
  const absl::Time give_up = absl::Now() + kWaitTimeout;
  do {
    absl::SleepFor(absl::Milliseconds(100));
    v1::GetIncomingRequest q;
    q.set_source_node("node-x");
    q.set_transfer_id("never-starts");
    grpc::ClientContext context;
    ASSERT_TRUE(peer->GetIncoming(&context, q, &state).ok());
  } while (state.open() && absl::Now() < give_up);
  EXPECT_FALSE(state.open());
  EXPECT_EQ(state.code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(state.reason(), "SOURCE_IDLE");
  v1::UnregisterTensorRequest request;
  request.set_name("kv");
  v1::UnregisterTensorResponse response;
  grpc::ClientContext context;
  EXPECT_TRUE(b_->stub().UnregisterTensor(&context, request, &response).ok());
}

}  // namespace
}  // namespace fuselink::testing
