// Shares per identity with real agents under mutual TLS and the default policy: one
// engine, viewer or router past its share is refused RESOURCE_EXHAUSTED with the
// share's reason, counted in fuselink_share_refusals_total; another identity of the
// same role is not affected; and giving back (unregistering, ending a watch, ending a
// transfer) makes room again. The agents run with small shares so that this is quick.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "clients/cpp/scrape.h"
#include "gtest/gtest.h"
#include "services/handle_socket/socket.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"
#include "tests/integration/pki.h"

namespace fuselink::testing {
namespace {

constexpr int kTensorShare = 2;
constexpr int kLayoutPartShare = 6;  // one 4-part tensor fits, two do not
constexpr int kWatchShare = 2;
constexpr int kTransferShare = 2;
constexpr uint32_t kLayers = 2, kBlocks = 8;
constexpr uint64_t kBlockBytes = 16 << 10;
constexpr uint64_t kTensorBytes = kLayers * kBlocks * kBlockBytes;

std::vector<std::string> ShareFlags(const std::string& node) {
  std::vector<std::string> flags = AgentTlsFlags(node, /*harness_policy=*/false);
  for (const std::string& f :
       {absl::StrCat("--max_tensors_per_engine=", kTensorShare),
        absl::StrCat("--max_layout_parts_per_engine=", kLayoutPartShare),
        absl::StrCat("--max_watches_per_identity=", kWatchShare),
        absl::StrCat("--max_transfers_per_router=", kTransferShare)}) {
    flags.push_back(f);
  }
  return flags;
}

// The strided form (no layout parts), or the parts form: 2 parts per block in every
// layer, 4 layout parts, each part's blocks packed one after another in the memfd.
v1::Layout StridedLayout() { return MakeLayout(kLayers, kBlocks, kBlockBytes); }
v1::Layout PartsLayout() {
  v1::Layout layout;
  layout.set_layers(kLayers);
  layout.set_blocks_per_layer(kBlocks);
  layout.set_parts_per_block(2);
  const uint64_t part_bytes = kBlockBytes / 2;
  for (uint32_t i = 0; i < 2 * kLayers; ++i) {
    v1::BlockPart* part = layout.add_parts();
    part->set_region(0);
    part->set_offset_bytes(i * kBlocks * part_bytes);
    part->set_bytes(part_bytes);
  }
  return layout;
}

// A memfd tensor registered through `stub`, whose certificate makes it the owner.
struct Lent {
  std::unique_ptr<client::HostBuffer> buffer;
  grpc::Status status;
};
Lent Register(v1::Agent::Stub& stub, AgentProcess& agent, const std::string& name,
              const v1::Layout& layout = StridedLayout()) {
  Lent out;
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> buffer =
      client::HostBuffer::Create(name, kTensorBytes);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  if (!buffer.ok()) return out;
  out.buffer = *std::move(buffer);
  absl::StatusOr<uint64_t> token =
      services::SendFd(agent.handle_socket(), out.buffer->fd());
  EXPECT_TRUE(token.ok()) << token.status();
  v1::RegisterTensorRequest request;
  request.set_name(name);
  *request.mutable_layout() = layout;
  request.mutable_memory()->mutable_host()->set_fd_token(token.ok() ? *token : 0);
  request.mutable_memory()->mutable_host()->set_size_bytes(kTensorBytes);
  v1::Tensor tensor;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  out.status = stub.RegisterTensor(&context, request, &tensor);
  return out;
}

grpc::Status Unregister(v1::Agent::Stub& stub, const std::string& name) {
  v1::UnregisterTensorRequest request;
  request.set_name(name);
  v1::UnregisterTensorResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  return stub.UnregisterTensor(&context, request, &response);
}

// The names ListTensors gives `stub`, one page.
std::vector<std::string> Listed(v1::Agent::Stub& stub) {
  v1::ListTensorsResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  grpc::Status status = stub.ListTensors(&context, v1::ListTensorsRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<std::string> names;
  for (const v1::Tensor& t : response.tensors()) names.push_back(t.name());
  return names;
}

double ShareRefusals(AgentProcess& agent, const std::string& reason) {
  absl::StatusOr<std::string> metrics =
      client::HttpGet(agent.metrics_url(), kWaitTimeout);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  if (!metrics.ok()) return -1;
  absl::StatusOr<double> v = client::MetricValue(
      *metrics, "fuselink_share_refusals_total", {{"reason", reason}});
  return v.ok() ? *v : -1;
}

class ShareTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartMutualNodes(ShareFlags(kNodeA), ShareFlags(kNodeB)));
  }
};

TEST_F(ShareTest, AnEngineRegistersItsShareOfTensorsAndListsOnlyItsOwn) {
  auto e1 = b_->StubAs("engine", "e1");
  auto e2 = b_->StubAs("engine", "e2");
  std::vector<Lent> held;
  for (int i = 0; i < kTensorShare; ++i) {
    held.push_back(Register(*e1, *b_, absl::StrCat("e1-", i)));
    ASSERT_TRUE(held.back().status.ok()) << held.back().status.error_message();
  }
  EXPECT_EQ(ShareRefusals(*b_, "TENSOR_SHARE"), 0);
  Lent over = Register(*e1, *b_, "e1-over");
  EXPECT_TRUE(
      HasError(over.status, grpc::StatusCode::RESOURCE_EXHAUSTED, "TENSOR_SHARE"));
  EXPECT_EQ(ShareRefusals(*b_, "TENSOR_SHARE"), 1);
  // Another engine has its own share.
  Lent other = Register(*e2, *b_, "e2-0");
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  // Each engine lists its own tensors only; a viewer lists every one.
  EXPECT_EQ(Listed(*e1), (std::vector<std::string>{"e1-0", "e1-1"}));
  EXPECT_EQ(Listed(*e2), (std::vector<std::string>{"e2-0"}));
  EXPECT_EQ(Listed(*b_->StubAs("viewer", "v1")),
            (std::vector<std::string>{"e1-0", "e1-1", "e2-0"}));
  // Unregistering gives the share back.
  ASSERT_TRUE(Unregister(*e1, "e1-0").ok());
  Lent again = Register(*e1, *b_, "e1-over");
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(ShareRefusals(*b_, "TENSOR_SHARE"), 1);
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(ShareTest, AnEngineHoldsItsShareOfLayoutParts) {
  auto e1 = b_->StubAs("engine", "e1");
  auto e2 = b_->StubAs("engine", "e2");
  Lent first = Register(*e1, *b_, "parts-1", PartsLayout());
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  // 4 + 4 parts pass the share of 6; a strided tensor holds none and still fits.
  Lent second = Register(*e1, *b_, "parts-2", PartsLayout());
  EXPECT_TRUE(
      HasError(second.status, grpc::StatusCode::RESOURCE_EXHAUSTED, "LAYOUT_PART_SHARE"));
  EXPECT_EQ(ShareRefusals(*b_, "LAYOUT_PART_SHARE"), 1);
  Lent other = Register(*e2, *b_, "parts-e2", PartsLayout());
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
  ASSERT_TRUE(Unregister(*e1, "parts-1").ok());
  Lent again = Register(*e1, *b_, "parts-2", PartsLayout());
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(ShareRefusals(*b_, "LAYOUT_PART_SHARE"), 1);
}

TEST_F(ShareTest, AViewerHoldsItsShareOfWatchStreams) {
  auto v1_stub = b_->StubAs("viewer", "v1");
  auto v2_stub = b_->StubAs("viewer", "v2");
  std::vector<std::unique_ptr<WatchCall>> watches;
  for (int i = 0; i < kWatchShare; ++i) {
    watches.push_back(std::make_unique<WatchCall>(*v1_stub, ""));
    ASSERT_TRUE(watches.back()->established()) << i;
  }
  WatchCall over(*v1_stub, "");
  EXPECT_FALSE(over.established());
  EXPECT_TRUE(
      HasError(over.WaitForEnd(), grpc::StatusCode::RESOURCE_EXHAUSTED, "WATCH_SHARE"));
  EXPECT_EQ(ShareRefusals(*b_, "WATCH_SHARE"), 1);
  WatchCall other(*v2_stub, "");
  EXPECT_TRUE(other.established());
  // Ending a stream gives its place back once the agent has seen the end: the next
  // watch is refused until then, so try until one is in place (bounded).
  watches.pop_back();
  const absl::Time give_up = absl::Now() + kWaitTimeout;
  bool placed = false;
  while (!placed && absl::Now() < give_up) {
    WatchCall again(*v1_stub, "");
    placed = again.established();
    if (!placed) {
      EXPECT_TRUE(HasError(again.WaitForEnd(), grpc::StatusCode::RESOURCE_EXHAUSTED,
                           "WATCH_SHARE"));
    }
  }
  EXPECT_TRUE(placed);
}

TEST_F(ShareTest, ARouterHoldsItsShareOfTransfers) {
  Lent source = Register(*a_->StubAs("engine", "e1"), *a_, "kv");
  ASSERT_TRUE(source.status.ok()) << source.status.error_message();
  Lent target = Register(*b_->StubAs("engine", "e1"), *b_, "kv");
  ASSERT_TRUE(target.status.ok()) << target.status.error_message();
  auto r1 = a_->StubAs("router", "r1");
  auto r2 = a_->StubAs("router", "r2");
  // Layer by layer with no layer ready: each stays in flight until cancelled.
  std::vector<std::unique_ptr<TransferCall>> held;
  for (uint32_t i = 0; i < kTransferShare; ++i) {
    v1::TransferRequest request =
        MakeRequest(absl::StrCat("held-", i), "kv", {i}, "kv", {i});
    request.set_layer_by_layer(true);
    held.push_back(std::make_unique<TransferCall>(*r1, request));
    ASSERT_TRUE(held.back()->WaitForEvent([](const v1::TransferEvent& e) {
      return e.has_accepted();
    })) << i;
  }
  TransferResult over = RunTransfer(*r1, MakeRequest("over", "kv", {4}, "kv", {4}));
  EXPECT_TRUE(
      HasError(over.status, grpc::StatusCode::RESOURCE_EXHAUSTED, "TRANSFER_SHARE"));
  EXPECT_TRUE(over.events.empty());
  EXPECT_EQ(ShareRefusals(*a_, "TRANSFER_SHARE"), 1);
  // Another router still gets a slot, and its transfer completes.
  TransferResult other = RunTransfer(*r2, MakeRequest("other", "kv", {5}, "kv", {5}));
  EXPECT_TRUE(other.status.ok()) << other.status.error_message();
  // Ending one of r1's transfers gives its slot back.
  v1::CancelTransferRequest cancel;
  cancel.set_request_id("held-0");
  v1::TransferStatus status;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  ASSERT_TRUE(r1->CancelTransfer(&context, cancel, &status).ok());
  TransferResult cancelled = held.front()->Finish();
  EXPECT_TRUE(HasError(cancelled.status, grpc::StatusCode::CANCELLED, "CANCELLED"));
  TransferResult again = RunTransfer(*r1, MakeRequest("again", "kv", {6}, "kv", {6}));
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(ShareRefusals(*a_, "TRANSFER_SHARE"), 1);
}

// A share of nothing, or past the bound it is a share of, stops the agent at start-up,
// naming the flag.
TEST_F(TwoNodeTest, AgentRefusesSharesOutOfRange) {
  for (const std::string flag :
       {"--max_tensors_per_engine=0", "--max_tensors_per_engine=65537",
        "--max_layout_parts_per_engine=0", "--max_watches_per_identity=0",
        "--max_transfers_per_router=0", "--grpc_max_streams_per_connection=0"}) {
    absl::StatusOr<std::unique_ptr<AgentProcess>> agent =
        AgentProcess::Start(dir_.path(), "node-x", {flag});
    ASSERT_FALSE(agent.ok()) << flag;
    const std::string name = flag.substr(0, flag.find('='));
    EXPECT_TRUE(absl::StrContains(agent.status().message(), name))
        << flag << ": " << agent.status().message();
  }
}

}  // namespace
}  // namespace fuselink::testing
