// In-node moves: source and target tensors on one agent. The bytes, the stream (one
// lane, "local", in place of NICs), the target's and the source's watches, layer by
// layer, a cancel, and the errors an in-node request can meet (a target that is the
// source's memory registered again among them), each with its code and reason. Host
// memory here; GPU to GPU and host to GPU run in tests/gpu.
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"

namespace fuselink::testing {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint32_t kBlocks = 32;
constexpr uint64_t kBlockBytes = 64 << 10;

class InNodeTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartNodes({"--policy=fuselink"}));
    const v1::Layout layout = MakeLayout(kLayers, kBlocks, kBlockBytes);
    for (auto [name, seed] : {std::pair{"prefill", 1}, std::pair{"decode", 2}}) {
      absl::StatusOr<HostTensor> t = RegisterTensor(*a_, name, layout, seed);
      ASSERT_TRUE(t.ok()) << t.status();
      tensors_.push_back(*std::move(t));
    }
  }
  const HostTensor& prefill() const { return tensors_[0]; }
  const HostTensor& decode() const { return tensors_[1]; }

  // prefill's `source_ids` to decode's `target_ids`, both on node-a.
  static v1::TransferRequest Local(const std::string& id,
                                   std::vector<uint32_t> source_ids,
                                   std::vector<uint32_t> target_ids,
                                   const std::string& target = "decode") {
    v1::TransferRequest request =
        MakeRequest(id, "prefill", std::move(source_ids), target, std::move(target_ids));
    request.mutable_target()->set_node(kNodeA);
    return request;
  }

  std::vector<HostTensor> tensors_;
};

TEST_F(InNodeTest, MovesBlocksBetweenTensorsOfOneAgentOnTheLocalLane) {
  WatchCall incoming(a_->stub(), "decode");
  WatchCall outgoing(a_->stub(), "prefill", /*outgoing=*/true);
  ASSERT_TRUE(incoming.established());
  ASSERT_TRUE(outgoing.established());
  std::vector<uint8_t> expected = Snapshot(decode());
  const std::vector<uint32_t> source_ids = {3, 7, 8, 9, 20, 31, 0};
  const std::vector<uint32_t> target_ids = {30, 1, 10, 11, 4, 16, 5};
  v1::TransferRequest request = Local("in-node", source_ids, target_ids);
  request.mutable_layers()->set_begin(1);
  request.mutable_layers()->set_end(4);
  TransferResult result = RunTransfer(a_->stub(), request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();

  const uint64_t total = source_ids.size() * 3 * kBlockBytes;
  ASSERT_GE(result.events.size(), 2u);
  const v1::TransferEvent& first = result.events.front();
  ASSERT_TRUE(first.has_accepted()) << first.DebugString();
  EXPECT_EQ(first.accepted().transport(), "local");
  EXPECT_EQ(first.accepted().total_bytes(), total);
  std::vector<uint32_t> layers_done;
  for (const v1::TransferEvent& e : result.events) {
    if (e.has_layer_done()) layers_done.push_back(e.layer_done().layer());
  }
  std::sort(layers_done.begin(), layers_done.end());
  EXPECT_EQ(layers_done, (std::vector<uint32_t>{1, 2, 3}));
  const v1::TransferEvent& last = result.events.back();
  ASSERT_TRUE(last.has_completed()) << last.DebugString();
  // The per-NIC split names the one lane: no NIC carried a byte.
  ASSERT_EQ(last.completed().per_nic_size(), 1);
  EXPECT_EQ(last.completed().per_nic(0).nic(), "local");
  EXPECT_EQ(last.completed().per_nic(0).bytes(), total);
  expected = Expected(prefill(), decode(), expected, source_ids, target_ids, 1, 4);
  EXPECT_TRUE(Holds(decode(), expected));

  const std::string& transfer_id = last.transfer_id();
  ASSERT_TRUE(incoming.WaitForEvents(1));
  const v1::WatchEvent in = incoming.events()[0];
  EXPECT_EQ(in.code(), 0) << in.message();
  EXPECT_EQ(in.transfer_id(), transfer_id);
  EXPECT_EQ(in.source_node(), kNodeA);
  EXPECT_EQ(in.bytes(), total);
  EXPECT_FALSE(in.outgoing());
  ASSERT_TRUE(outgoing.WaitForEvents(1));
  const v1::WatchEvent out = outgoing.events()[0];
  EXPECT_EQ(out.code(), 0) << out.message();
  EXPECT_TRUE(out.outgoing());
  EXPECT_EQ(out.transfer_id(), transfer_id);
  EXPECT_EQ(out.target_node(), kNodeA);
  EXPECT_EQ(out.tensor(), "prefill");
  EXPECT_EQ(std::vector<uint32_t>(out.block_ids().begin(), out.block_ids().end()),
            source_ids);
}

TEST_F(InNodeTest, MovesBlocksWithinOneTensor) {
  std::vector<uint8_t> expected = Snapshot(prefill());
  v1::TransferRequest request = Local("within", {0, 1, 2}, {5, 4, 30}, "prefill");
  TransferResult result = RunTransfer(a_->stub(), request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_TRUE(result.events.back().has_completed());
  expected = Expected(prefill(), prefill(), expected, {0, 1, 2}, {5, 4, 30}, 0, kLayers);
  EXPECT_TRUE(Holds(prefill(), expected));
}

TEST_F(InNodeTest, LayerByLayerSendsEachLayerAsItIsReady) {
  std::vector<uint8_t> expected = Snapshot(decode());
  v1::TransferRequest request = Local("layered", {6, 2}, {2, 6});
  request.set_layer_by_layer(true);
  TransferCall call(a_->stub(), request);
  ASSERT_TRUE(
      call.WaitForEvent([](const v1::TransferEvent& e) { return e.has_accepted(); }));
  for (uint32_t end = 1; end <= kLayers; ++end) {
    ASSERT_TRUE(LayersReady(a_->stub(), "layered", end).ok());
    ASSERT_TRUE(call.WaitForEvent([end](const v1::TransferEvent& e) {
      return e.has_layer_done() && e.layer_done().layer() == end - 1;
    })) << "layer "
        << end - 1;
  }
  TransferResult result = call.Finish();
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_TRUE(result.events.back().has_completed());
  expected = Expected(prefill(), decode(), expected, {6, 2}, {2, 6}, 0, kLayers);
  EXPECT_TRUE(Holds(decode(), expected));
}

TEST_F(InNodeTest, ACancelledMoveEndsCancelledAndTheTargetHearsOfIt) {
  WatchCall incoming(a_->stub(), "decode");
  ASSERT_TRUE(incoming.established());
  v1::TransferRequest request = Local("waits", {1}, {1});
  request.set_layer_by_layer(true);  // no layer ever ready: it waits
  TransferCall call(a_->stub(), request);
  ASSERT_TRUE(
      call.WaitForEvent([](const v1::TransferEvent& e) { return e.has_accepted(); }));
  v1::CancelTransferRequest cancel;
  cancel.set_request_id("waits");
  v1::TransferStatus status;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  ASSERT_TRUE(a_->stub().CancelTransfer(&context, cancel, &status).ok());
  TransferResult result = call.Finish();
  EXPECT_TRUE(HasError(result.status, grpc::StatusCode::CANCELLED, "CANCELLED"));
  ASSERT_TRUE(incoming.WaitForEvents(1));
  const v1::WatchEvent in = incoming.events()[0];
  EXPECT_NE(in.code(), 0);
  EXPECT_EQ(in.source_node(), kNodeA);
  // Both tensors are free again.
  EXPECT_TRUE(UnregisterTensor(*a_, "decode").ok());
  EXPECT_TRUE(UnregisterTensor(*a_, "prefill").ok());
}

TEST_F(InNodeTest, BadInNodeRequestsAreRefusedWithTheirReasons) {
  struct Case {
    v1::TransferRequest request;
    grpc::StatusCode code;
    const char* reason;
  };
  absl::StatusOr<HostTensor> wide =
      RegisterTensor(*a_, "wide", MakeLayout(kLayers, kBlocks, 2 * kBlockBytes), 3);
  ASSERT_TRUE(wide.ok()) << wide.status();
  const Case cases[] = {
      {Local("same", {0, 1}, {2, 1}, "prefill"), grpc::StatusCode::INVALID_ARGUMENT,
       "SAME_BLOCKS"},
      {Local("unknown", {0}, {0}, "no-such"), grpc::StatusCode::NOT_FOUND,
       "UNKNOWN_TENSOR"},
      {Local("outside", {0}, {kBlocks}), grpc::StatusCode::OUT_OF_RANGE,
       "BLOCK_OUT_OF_RANGE"},
      {Local("sizes", {0}, {0}, "wide"), grpc::StatusCode::INVALID_ARGUMENT,
       "BLOCK_SIZE_MISMATCH"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.request.request_id());
    TransferResult result = RunTransfer(a_->stub(), c.request);
    EXPECT_TRUE(HasError(result.status, c.code, c.reason));
  }
  // "decode" lent once more, as "alias": the same memfd, mapped a second time. A move
  // between the two would overwrite blocks it has yet to read; it is refused, and
  // nothing is written.
  ASSERT_TRUE(client::RegisterHostTensor(a_->stub(), a_->handle_socket(), "alias",
                                         decode().layout, *decode().buffer)
                  .ok());
  const std::vector<uint8_t> before = Snapshot(decode());
  for (auto [source, target] :
       {std::pair{"decode", "alias"}, std::pair{"alias", "decode"}}) {
    v1::TransferRequest request =
        Local(absl::StrCat(source, "-to-", target), {0, 1}, {1, 2}, target);
    request.mutable_source()->set_tensor(source);
    SCOPED_TRACE(request.request_id());
    EXPECT_TRUE(HasError(RunTransfer(a_->stub(), request).status,
                         grpc::StatusCode::INVALID_ARGUMENT, "ALIASED_TENSORS"));
  }
  EXPECT_EQ(Snapshot(decode()), before);
  // Another tensor's memory is not the alias's: that move runs.
  TransferResult other = RunTransfer(a_->stub(), Local("other", {3}, {3}, "alias"));
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();

  // The agent still moves a good one.
  TransferResult good = RunTransfer(a_->stub(), Local("good", {0}, {0}));
  ASSERT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_TRUE(good.events.back().has_completed());
}

}  // namespace
}  // namespace fuselink::testing
