// Agents that die mid-transfer, peers that cannot be reached, deadlines, the limit
// on transfers in flight, and garbage on a NIC port. After each, the agents that
// live go on serving.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/fabric/handshake.h"
#include "agent/fabric/wire.h"
#include "clients/cpp/scrape.h"
#include "fuselink/v1/peer.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"
#include "tests/integration/net_util.h"
#include "tests/integration/pki.h"

namespace fuselink::testing {
namespace {

// Small tensors for the transfers that must succeed.
const v1::Layout kSmallLayout = MakeLayout(2, 8, 16 << 10);
// A transfer still running when the test acts on it: 64 MiB in 4 KiB chunks, one in
// flight at a time, is 16384 round trips (about 0.5 s here, hundreds of ms on any
// machine). Tests that need it to stand still longer pause an agent.
const v1::Layout kBigLayout = MakeLayout(1, 64, 1 << 20);
const std::vector<std::string> kSlowFlags = {"--chunk_bytes=4096", "--window_chunks=1"};

google::protobuf::Timestamp Timestamp(absl::Time t) {
  const int64_t seconds = absl::ToUnixSeconds(t);
  google::protobuf::Timestamp out;
  out.set_seconds(seconds);
  out.set_nanos(
      static_cast<int32_t>((t - absl::FromUnixSeconds(seconds)) / absl::Nanoseconds(1)));
  return out;
}

std::vector<uint32_t> AllBlocks(const v1::Layout& layout) {
  std::vector<uint32_t> ids(layout.blocks_per_layer());
  for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
  return ids;
}

// The same tensor name on both nodes: node-a's memory and node-b's.
struct TensorPair {
  HostTensor source;
  HostTensor target;
};

class FailureTest : public TwoNodeTest {
 protected:
  // Registers `name` with `layout` on node-a (source) and node-b (target).
  void RegisterPair(const std::string& name, const v1::Layout& layout, TensorPair* out) {
    absl::StatusOr<HostTensor> source = RegisterTensor(*a_, name, layout, 11);
    ASSERT_TRUE(source.ok()) << source.status();
    absl::StatusOr<HostTensor> target = RegisterTensor(*b_, name, layout, 12);
    ASSERT_TRUE(target.ok()) << target.status();
    out->source = *std::move(source);
    out->target = *std::move(target);
  }

  v1::TransferRequest BigRequest(const std::string& request_id) {
    return MakeRequest(request_id, "big", AllBlocks(kBigLayout), "big",
                       AllBlocks(kBigLayout));
  }

  // A small transfer node-a -> node-b completes and its bytes land.
  ::testing::AssertionResult MovesSmallTransfer(const std::string& request_id) {
    TransferResult result = RunTransfer(
        a_->stub(), MakeRequest(request_id, "small", {1, 6}, "small", {7, 0}));
    if (!result.status.ok() || result.events.empty() ||
        !result.events.back().has_completed()) {
      return ::testing::AssertionFailure()
             << "transfer " << request_id << ": " << result.status.error_code() << " "
             << result.status.error_message();
    }
    for (uint32_t layer = 0; layer < kSmallLayout.layers(); ++layer) {
      for (auto [s, t] : {std::pair{1u, 7u}, std::pair{6u, 0u}}) {
        if (std::memcmp(small_.source.Block(layer, s).data(),
                        small_.target.Block(layer, t).data(),
                        kSmallLayout.block_bytes()) != 0) {
          return ::testing::AssertionFailure()
                 << "block " << s << " of layer " << layer << " did not land in " << t;
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  TensorPair small_;  // kSmallLayout, "small"
  TensorPair big_;    // kBigLayout, "big"
};

TEST_F(FailureTest, UnreachablePeerIsUnavailable) {
  uint16_t port = 0;
  absl::StatusOr<UniqueFd> closed = ReserveClosedPort(&port);
  ASSERT_TRUE(closed.ok()) << closed.status();
  ASSERT_NO_FATAL_FAILURE(StartNodes({}, {}, absl::StrCat("node-c=127.0.0.1:", port)));
  ASSERT_NO_FATAL_FAILURE(RegisterPair("small", kSmallLayout, &small_));

  v1::TransferRequest request = MakeRequest("to-c", "small", {0}, "small", {0});
  request.mutable_target()->set_node("node-c");
  TransferResult result = RunTransfer(a_->stub(), request);
  EXPECT_TRUE(HasError(result.status, grpc::StatusCode::UNAVAILABLE, "PEER_UNREACHABLE"));
  EXPECT_TRUE(result.events.empty());
  EXPECT_TRUE(Serves(*a_));
  EXPECT_TRUE(MovesSmallTransfer("to-b"));
}

// A peer whose port takes connections and never answers (a hung host behind a live
// kernel): transfers to it wait out their bootstrap off the engine's prepare threads,
// so a transfer to a healthy peer completes while they still wait; then they fail
// UNAVAILABLE.
TEST_F(FailureTest, ATargetThatNeverAnswersHoldsUpNoOtherTransfer) {
  uint16_t port = 0;
  absl::StatusOr<UniqueFd> hole = ReserveClosedPort(&port);
  ASSERT_TRUE(hole.ok()) << hole.status();
  ASSERT_EQ(listen(hole->get(), 64), 0);  // connections queue; nobody reads them
  ASSERT_NO_FATAL_FAILURE(StartNodes({}, {}, absl::StrCat("node-h=127.0.0.1:", port)));
  ASSERT_NO_FATAL_FAILURE(RegisterPair("small", kSmallLayout, &small_));
  std::vector<std::unique_ptr<TransferCall>> stuck;
  for (int i = 0; i < 4; ++i) {  // more than the engine has prepare threads
    v1::TransferRequest request =
        MakeRequest(absl::StrCat("to-h-", i), "small", {0}, "small", {0});
    request.mutable_target()->set_node("node-h");
    stuck.push_back(std::make_unique<TransferCall>(a_->stub(), request));
  }
  EXPECT_TRUE(MovesSmallTransfer("to-b"));
  for (int i = 0; i < 4; ++i) {
    v1::GetTransferRequest get;
    get.set_request_id(absl::StrCat("to-h-", i));
    v1::TransferStatus status;
    grpc::ClientContext context;
    ASSERT_TRUE(a_->stub().GetTransfer(&context, get, &status).ok());
    EXPECT_EQ(status.state(), v1::TRANSFER_STATE_RUNNING)
        << "transfer " << i << " ended before the healthy one completed";
  }
  for (auto& call : stuck) {
    TransferResult r = call->Finish();
    EXPECT_TRUE(HasError(r.status, grpc::StatusCode::UNAVAILABLE, "PEER_UNREACHABLE"))
        << r.status.error_message();
  }
  EXPECT_TRUE(Serves(*a_));
}

// The gRPC half of a peer whose fabric hangs: it answers Hello as node `name`, and
// names for every NIC a fabric port whose kernel takes connections that nobody reads.
class HelloOnlyPeer final : public v1::Peer::Service {
 public:
  HelloOnlyPeer(std::string name, uint16_t fabric_port)
      : name_(std::move(name)), fabric_port_(fabric_port) {}

  grpc::Status Hello(grpc::ServerContext*, const v1::HelloRequest* request,
                     v1::HelloResponse* response) override {
    response->set_version(request->version());
    response->mutable_topology()->set_node(name_);
    for (const v1::Nic& theirs : request->topology().nics()) {
      v1::Nic* nic = response->mutable_topology()->add_nics();
      nic->set_name(theirs.name());
      nic->set_index(theirs.index());
      nic->set_address("127.0.0.1");
      nic->set_port(fabric_port_);
    }
    response->set_fabric_key(std::string(32, '\x5a'));
    answered_.Notify();
    return grpc::Status::OK;
  }
  bool WaitUntilAnswered() {
    return answered_.WaitForNotificationWithTimeout(kWaitTimeout);
  }

 private:
  const std::string name_;
  const uint16_t fabric_port_;
  absl::Notification answered_;
};

// SIGTERM while a fabric connect to a peer waits out its 10 s handshake timeout: the
// agent ends it and exits within 2 s, and the transfer waiting on it fails.
TEST_F(FailureTest, ShutdownEndsAFabricConnectUnderWay) {
  uint16_t fabric_port = 0;
  absl::StatusOr<UniqueFd> deaf = ReserveClosedPort(&fabric_port);
  ASSERT_TRUE(deaf.ok()) << deaf.status();
  ASSERT_EQ(listen(deaf->get(), 64), 0);  // connections queue; nobody reads them
  HelloOnlyPeer peer("node-h", fabric_port);
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort("127.0.0.1:0", ServerCredentialsAs("node", "node-h"),
                           &grpc_port);
  builder.RegisterService(&peer);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_NO_FATAL_FAILURE(
      StartNodes({}, {}, absl::StrCat("node-h=127.0.0.1:", grpc_port)));
  ASSERT_NO_FATAL_FAILURE(RegisterPair("small", kSmallLayout, &small_));

  v1::TransferRequest request = MakeRequest("to-h", "small", {0}, "small", {0});
  request.mutable_target()->set_node("node-h");
  TransferCall call(a_->stub(), request);
  ASSERT_TRUE(peer.WaitUntilAnswered());
  // The fabric's connect has reached the deaf port: a connection waits in its queue.
  pollfd queued{.fd = deaf->get(), .events = POLLIN, .revents = 0};
  ASSERT_EQ(poll(&queued, 1, absl::ToInt64Milliseconds(kWaitTimeout)), 1)
      << "node-a never connected its fabric to node-h";
  a_->Terminate();
  const absl::Time terminated = absl::Now();
  absl::Status stopped = a_->Stop();
  const absl::Duration took = absl::Now() - terminated;
  EXPECT_TRUE(stopped.ok()) << stopped;
  // 2 s is the rule; the margin is for sanitizer builds on a loaded machine. Waiting
  // out the connect took over 10 s.
  EXPECT_LT(took, absl::Seconds(4)) << "the agent took " << took << " to exit";
  TransferResult result = call.Finish();
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << result.status.error_message();
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

// Each set of flags stops an agent at start-up with a message naming its last flag.
void ExpectRefusedAtStart(const std::string& dir,
                          const std::vector<std::vector<std::string>>& refused) {
  for (const std::vector<std::string>& flags : refused) {
    absl::StatusOr<std::unique_ptr<AgentProcess>> agent =
        AgentProcess::Start(dir, "node-x", flags);
    ASSERT_FALSE(agent.ok()) << flags.back();
    const std::string name = flags.back().substr(0, flags.back().find('='));
    EXPECT_TRUE(absl::StrContains(agent.status().message(), name))
        << flags.back() << ": " << agent.status().message();
  }
}

// RDMA traffic classes, service levels and QP limits out of their ranges stop the
// agent at start-up, whatever the transport, naming the flag.
TEST_F(FailureTest, AgentRefusesRdmaFlagsOutOfRange) {
  const std::vector<std::vector<std::string>> refused = {
      {"--rdma_traffic_class=256"},
      {"--rdma_traffic_class=-1"},
      {"--rdma_service_level=16"},
      {"--rdma_max_qps_per_nic=0"},
      {"--rdma_max_qps_per_nic=4097"},
      {"--qps_per_nic=4", "--rdma_max_qps_per_nic=2"},  // fewer than one peer needs
      {"--rdma_staging_slots=0"},
      {"--rdma_staging_slots=4097"},
      {"--rdma_staging_slots=4", "--rdma_staging_slots_per_peer=5"},  // past the NIC's
      {"--rdma_max_shadow_mib=0"},
      {"--gpudirect_max_class=FAR"},
  };
  ExpectRefusedAtStart(dir_.path(), refused);
}

// The liveness bounds and the queues in front of blocking work, out of their ranges,
// stop the agent at start-up naming the flag (no silent clamp).
TEST_F(FailureTest, AgentRefusesBoundsOutOfRange) {
  const std::vector<std::vector<std::string>> refused = {
      {"--fabric_stall_timeout_ms=0"},
      {"--fabric_ack_timeout_ms=0"},
      {"--fabric_ack_timeout_ms=3600001"},
      {"--incoming_idle_timeout_ms=999"},
      {"--incoming_idle_timeout_ms=3600001"},
      {"--metrics_auth_queue_depth=0"},
      {"--metrics_auth_queue_depth=1025"},
      {"--prepare_threads=0"},
      {"--prepare_threads=8", "--prepare_threads_per_target=9"},
      {"--registrations_per_caller=0"},
  };
  ExpectRefusedAtStart(dir_.path(), refused);
  // A node whose start fails after its options passed (here the transport) exits
  // with its reason, not a crash of the half-made node's teardown (it was SIGSEGV).
  absl::StatusOr<std::unique_ptr<AgentProcess>> agent =
      AgentProcess::Start(dir_.path(), "node-x", {"--transport=bogus"});
  ASSERT_FALSE(agent.ok());
  EXPECT_TRUE(absl::StrContains(agent.status().message(), "(status 256)"))  // exit(1)
      << agent.status().message();
  EXPECT_TRUE(absl::StrContains(agent.status().message(), "BAD_TRANSPORT"))
      << agent.status().message();
}

TEST_F(FailureTest, TransfersPastTheLimitAreRefusedUntilOneEnds) {
  std::vector<std::string> flags = kSlowFlags;
  flags.push_back("--max_transfers=1");
  ASSERT_NO_FATAL_FAILURE(StartNodes(flags));
  ASSERT_NO_FATAL_FAILURE(RegisterPair("big", kBigLayout, &big_));
  ASSERT_NO_FATAL_FAILURE(RegisterPair("small", kSmallLayout, &small_));
  WatchCall watch(b_->stub(), "big");
  ASSERT_TRUE(watch.established());

  TransferCall first(a_->stub(), BigRequest("first"));
  ASSERT_TRUE(first.WaitUntilMoving());
  // The source stands still: the target holds its slot, and the tensor with it.
  a_->Pause();
  EXPECT_TRUE(HasError(UnregisterTensor(*b_, "big"),
                       grpc::StatusCode::FAILED_PRECONDITION, "TENSOR_IN_USE"));
  // Now the target stands still: the transfer cannot finish, whatever the timing.
  b_->Pause();
  a_->Resume();
  TransferResult second =
      RunTransfer(a_->stub(), MakeRequest("second", "small", {0}, "small", {0}));
  EXPECT_TRUE(HasError(second.status, grpc::StatusCode::RESOURCE_EXHAUSTED,
                       "TOO_MANY_TRANSFERS"));
  EXPECT_TRUE(second.events.empty());
  EXPECT_TRUE(HasError(UnregisterTensor(*a_, "big"),
                       grpc::StatusCode::FAILED_PRECONDITION, "TENSOR_IN_USE"));

  // Cancelling ends the first once its chunk in flight drains: its stream says so,
  // and the target drops its slot.
  v1::CancelTransferRequest cancel;
  cancel.set_request_id("first");
  v1::TransferStatus status;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  ASSERT_TRUE(a_->stub().CancelTransfer(&context, cancel, &status).ok());
  b_->Resume();
  TransferResult cancelled = first.Finish();
  EXPECT_TRUE(HasError(cancelled.status, grpc::StatusCode::CANCELLED, "CANCELLED"));
  ASSERT_FALSE(cancelled.events.empty());
  EXPECT_TRUE(cancelled.events.front().has_accepted());
  const v1::TransferEvent& last = cancelled.events.back();
  ASSERT_TRUE(last.has_failed()) << last.DebugString();
  EXPECT_EQ(last.failed().code(), static_cast<int>(grpc::StatusCode::CANCELLED));
  EXPECT_EQ(last.failed().reason(), "CANCELLED");
  ASSERT_TRUE(watch.WaitForEvents(1));
  EXPECT_EQ(watch.events()[0].code(), static_cast<int>(grpc::StatusCode::ABORTED))
      << watch.events()[0].message();
  EXPECT_EQ(watch.events()[0].transfer_id(), last.transfer_id());

  EXPECT_TRUE(MovesSmallTransfer("third"));
  grpc::Status ua = UnregisterTensor(*a_, "big");
  EXPECT_TRUE(ua.ok()) << ua.error_message();
  grpc::Status ub = UnregisterTensor(*b_, "big");
  EXPECT_TRUE(ub.ok()) << ub.error_message();
}

TEST_F(FailureTest, DeadlineAlreadyPassed) {
  ASSERT_NO_FATAL_FAILURE(StartNodes());
  ASSERT_NO_FATAL_FAILURE(RegisterPair("small", kSmallLayout, &small_));
  v1::TransferRequest request = MakeRequest("late", "small", {0, 1}, "small", {0, 1});
  *request.mutable_deadline() = Timestamp(absl::Now() - absl::Seconds(1));
  TransferResult result = RunTransfer(a_->stub(), request);
  EXPECT_TRUE(HasError(result.status, grpc::StatusCode::DEADLINE_EXCEEDED, "DEADLINE"));
  for (const v1::TransferEvent& e : result.events) EXPECT_FALSE(e.has_completed());
  EXPECT_TRUE(MovesSmallTransfer("in-time"));
}

TEST_F(FailureTest, DeadlineThatPassesMidTransfer) {
  ASSERT_NO_FATAL_FAILURE(StartNodes(kSlowFlags));
  ASSERT_NO_FATAL_FAILURE(RegisterPair("big", kBigLayout, &big_));
  ASSERT_NO_FATAL_FAILURE(RegisterPair("small", kSmallLayout, &small_));
  v1::TransferRequest request = BigRequest("short-deadline");
  const absl::Time deadline = absl::Now() + absl::Milliseconds(1500);
  *request.mutable_deadline() = Timestamp(deadline);
  TransferCall call(a_->stub(), request);
  ASSERT_TRUE(call.WaitUntilMoving());
  // The target stands still until the deadline has passed.
  b_->Pause();
  absl::SleepFor(deadline - absl::Now() + absl::Milliseconds(100));
  b_->Resume();
  TransferResult result = call.Finish();
  EXPECT_TRUE(HasError(result.status, grpc::StatusCode::DEADLINE_EXCEEDED, "DEADLINE"));
  ASSERT_GE(result.events.size(), 2u);
  EXPECT_TRUE(result.events.front().has_accepted());
  const v1::TransferEvent& last = result.events.back();
  ASSERT_TRUE(last.has_failed()) << last.DebugString();
  EXPECT_EQ(last.failed().code(), static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_EQ(last.failed().reason(), "DEADLINE");
  EXPECT_TRUE(MovesSmallTransfer("after"));
}

TEST_F(FailureTest, TargetKilledMidTransfer) {
  ASSERT_NO_FATAL_FAILURE(StartNodes(kSlowFlags));
  ASSERT_NO_FATAL_FAILURE(RegisterPair("big", kBigLayout, &big_));
  ASSERT_NO_FATAL_FAILURE(RegisterPair("small", kSmallLayout, &small_));

  TransferCall call(a_->stub(), BigRequest("doomed"));
  ASSERT_TRUE(call.WaitUntilMoving());
  const absl::Time killed = absl::Now();
  b_->Kill();
  TransferResult result = call.Finish();
  EXPECT_TRUE(HasError(result.status, grpc::StatusCode::UNAVAILABLE, "PEER_LOST"));
  EXPECT_LT(result.ended - killed, absl::Seconds(10));  // the call's deadline is 60 s
  ASSERT_FALSE(result.events.empty());
  ASSERT_TRUE(result.events.back().has_failed()) << result.events.back().DebugString();
  EXPECT_EQ(result.events.back().failed().code(),
            static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  EXPECT_TRUE(Serves(*a_));
  // The source is free again.
  EXPECT_TRUE(UnregisterTensor(*a_, "big").ok());

  // node-b comes back at the same address; node-a reaches it again.
  const std::string address = b_->grpc_address();
  retired_logs_.push_back(b_->Log());
  b_.reset();
  absl::StatusOr<std::unique_ptr<AgentProcess>> b =
      AgentProcess::Start(dir_.path(), kNodeB, {absl::StrCat("--listen=", address)});
  ASSERT_TRUE(b.ok()) << b.status();
  b_ = *std::move(b);
  absl::StatusOr<HostTensor> target = RegisterTensor(*b_, "small", kSmallLayout, 13);
  ASSERT_TRUE(target.ok()) << target.status();
  small_.target = *std::move(target);
  // The first calls may find node-a's channel still reconnecting.
  ::testing::AssertionResult moved = ::testing::AssertionFailure();
  const absl::Time give_up = absl::Now() + kWaitTimeout;
  for (int attempt = 0; !moved && absl::Now() < give_up; ++attempt) {
    moved = MovesSmallTransfer(absl::StrCat("after-restart-", attempt));
    if (!moved) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(moved);
}

TEST_F(FailureTest, SourceKilledMidTransfer) {
  ASSERT_NO_FATAL_FAILURE(StartNodes(kSlowFlags));
  ASSERT_NO_FATAL_FAILURE(RegisterPair("big", kBigLayout, &big_));
  WatchCall watch(b_->stub(), "");
  ASSERT_TRUE(watch.established());

  TransferCall call(a_->stub(), BigRequest("orphaned"));
  ASSERT_TRUE(call.WaitUntilMoving());
  a_->Kill();
  TransferResult result = call.Finish();
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << result.status.error_message();
  ASSERT_FALSE(result.events.empty());

  // node-b fails the incoming transfer when the connections drop, well before the
  // 30 s after which it gives up on a silent source (SOURCE_IDLE).
  ASSERT_TRUE(watch.WaitForEvents(1, absl::Seconds(10)));
  const v1::WatchEvent event = watch.events()[0];
  EXPECT_EQ(event.code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE))
      << event.message();
  EXPECT_EQ(event.transfer_id(), result.events.front().transfer_id());
  EXPECT_EQ(event.source_node(), kNodeA);
  EXPECT_EQ(event.tensor(), "big");
  EXPECT_LT(event.bytes(), kBigLayout.blocks_per_layer() * kBigLayout.block_bytes());
  EXPECT_TRUE(Serves(*b_));
  // The landing slot let go of the target tensor.
  EXPECT_TRUE(UnregisterTensor(*b_, "big").ok());
}

// The engine that lent a tensor exits: the agent fails the transfers that use it, on
// both sides, and forgets the tensor.
TEST_F(FailureTest, OwnerExitingMidTransferFailsItAndDropsTheTensor) {
  ASSERT_NO_FATAL_FAILURE(StartNodes(kSlowFlags));
  const pid_t engine = fork();
  ASSERT_GE(engine, 0);
  if (engine == 0) {  // the lending engine: waits to be killed
    pause();
    _exit(0);
  }
  UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, engine, 0)));
  ASSERT_GE(pidfd.get(), 0) << std::strerror(errno);
  absl::StatusOr<HostTensor> source =
      RegisterTensor(*a_, "big", kBigLayout, 11, 0, pidfd.get());
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<HostTensor> target = RegisterTensor(*b_, "big", kBigLayout, 12);
  ASSERT_TRUE(target.ok()) << target.status();
  WatchCall watch(b_->stub(), "");
  ASSERT_TRUE(watch.established());

  TransferCall call(a_->stub(), BigRequest("owner-exits"));
  ASSERT_TRUE(call.WaitUntilMoving());
  kill(engine, SIGKILL);
  waitpid(engine, nullptr, 0);
  TransferResult result = call.Finish();
  EXPECT_TRUE(
      HasError(result.status, grpc::StatusCode::FAILED_PRECONDITION, "OWNER_EXITED"));
  ASSERT_FALSE(result.events.empty());
  EXPECT_TRUE(result.events.back().has_failed()) << result.events.back().DebugString();
  // The target hears of it through the source's abort.
  ASSERT_TRUE(watch.WaitForEvents(1, absl::Seconds(10)));
  EXPECT_NE(watch.events()[0].code(), 0);
  // node-a forgot the tensor: the name is free again.
  v1::GetTensorRequest get;
  get.set_name("big");
  v1::Tensor tensor;
  grpc::ClientContext context;
  EXPECT_TRUE(HasError(a_->stub().GetTensor(&context, get, &tensor),
                       grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  absl::StatusOr<HostTensor> again = RegisterTensor(*a_, "big", kBigLayout, 13);
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(Serves(*a_));
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(FailureTest, MalformedFrameOnANicPortClosesOnlyThatConnection) {
  ASSERT_NO_FATAL_FAILURE(StartNodes());
  ASSERT_NO_FATAL_FAILURE(RegisterPair("small", kSmallLayout, &small_));
  auto malformed = [&]() -> absl::StatusOr<double> {
    absl::StatusOr<std::string> metrics =
        client::HttpGet(b_->metrics_url(), kWaitTimeout);
    if (!metrics.ok()) return metrics.status();
    return client::MetricValue(*metrics, "fuselink_fabric_malformed_frames_total",
                               {{"nic", "rail0"}});
  };
  absl::StatusOr<double> before = malformed();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(*before, 0);

  v1::Topology topology;
  ASSERT_TRUE(GetTopology(*b_, &topology).ok());
  ASSERT_GT(topology.nics_size(), 0);
  const v1::Nic& rail0 = topology.nics(0);
  ASSERT_EQ(rail0.name(), "rail0");
  absl::StatusOr<UniqueFd> socket =
      TcpConnect(rail0.address(), static_cast<uint16_t>(rail0.port()));
  ASSERT_TRUE(socket.ok()) << socket.status();
  std::vector<uint8_t> garbage(64, 0xEE);  // longer than a frame header
  ASSERT_EQ(send(socket->get(), garbage.data(), garbage.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(garbage.size()));
  ASSERT_TRUE(WaitUntilClosed(socket->get(), kWaitTimeout));

  absl::StatusOr<double> after = malformed();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, 1);
  EXPECT_TRUE(Serves(*b_));
  EXPECT_TRUE(MovesSmallTransfer("after-garbage"));
}

// Someone on the network who knows a NIC port and a node name, but not the key the
// peers agreed over mutual TLS: its HELLO under a real peer's name gets a challenge it
// cannot answer; the writes it sends instead are never read, the connection is closed
// and counted, nothing lands, and the agent goes on moving real transfers.
TEST_F(FailureTest, ForgedHelloIsClosedAndLandsNothing) {
  ASSERT_NO_FATAL_FAILURE(StartNodes());
  ASSERT_NO_FATAL_FAILURE(RegisterPair("small", kSmallLayout, &small_));
  ASSERT_TRUE(MovesSmallTransfer("before-forgery"));  // node-a is a known peer now
  const std::vector<uint8_t> before(small_.target.buffer->span().begin(),
                                    small_.target.buffer->span().end());
  v1::Topology topology;
  ASSERT_TRUE(GetTopology(*b_, &topology).ok());
  const v1::Nic& rail0 = topology.nics(0);
  absl::StatusOr<UniqueFd> socket =
      TcpConnect(rail0.address(), static_cast<uint16_t>(rail0.port()));
  ASSERT_TRUE(socket.ok()) << socket.status();
  absl::StatusOr<fabric::handshake::Nonce> nonce = fabric::handshake::NewNonce();
  ASSERT_TRUE(nonce.ok());
  std::string frames = *fabric::wire::EncodeHello(0, kNodeA, *nonce);  // posing as node-a
  for (uint32_t i = 0; i < 64; ++i) {
    const fabric::wire::HeaderBytes header = fabric::wire::EncodeWrite(
        {.key = i + 1, .offset = (i % 4) * 4096, .bytes = 64, .imm = i, .wr_id = i});
    frames.append(reinterpret_cast<const char*>(header.data()), header.size());
    frames.append(64, static_cast<char>(0xEE));
  }
  // The agent may close before it has read everything: a short send is fine.
  send(socket->get(), frames.data(), frames.size(), MSG_NOSIGNAL);
  ASSERT_TRUE(WaitUntilClosed(socket->get(), kWaitTimeout));
  EXPECT_TRUE(
      std::equal(before.begin(), before.end(), small_.target.buffer->span().begin()))
      << "a forged write changed the target tensor";
  absl::StatusOr<std::string> metrics = client::HttpGet(b_->metrics_url(), kWaitTimeout);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(*client::MetricValue(*metrics, "fuselink_fabric_auth_failures_total",
                                 {{"nic", "rail0"}}),
            1);
  EXPECT_EQ(*client::MetricValue(*metrics, "fuselink_fabric_refused_writes_total",
                                 {{"nic", "rail0"}}),
            0);
  EXPECT_TRUE(Serves(*b_));
  EXPECT_TRUE(MovesSmallTransfer("after-forgery"));
}

// A lender that shrinks a memfd it lent could crash the agent (SIGBUS on the next
// access); the agent sealed it, so the shrink fails and transfers go on.
TEST_F(FailureTest, LenderCannotShrinkWhatItLent) {
  ASSERT_NO_FATAL_FAILURE(StartNodes());
  ASSERT_NO_FATAL_FAILURE(RegisterPair("small", kSmallLayout, &small_));
  EXPECT_NE(ftruncate(small_.source.buffer->fd(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(small_.target.buffer->fd(), 4096), 0);
  EXPECT_TRUE(MovesSmallTransfer("after-shrink"));
  EXPECT_TRUE(Serves(*a_));
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(FailureTest, AgentsStopCleanlyOnSigterm) {
  ASSERT_NO_FATAL_FAILURE(StartNodes());
  ASSERT_NO_FATAL_FAILURE(RegisterPair("small", kSmallLayout, &small_));
  ASSERT_TRUE(MovesSmallTransfer("before-stop"));
  // Both at once: each takes seconds to close its gRPC and HTTP servers.
  a_->Terminate();
  b_->Terminate();
  absl::Status a = a_->Stop();
  EXPECT_TRUE(a.ok()) << a;
  absl::Status b = b_->Stop();
  EXPECT_TRUE(b.ok()) << b;
}

}  // namespace
}  // namespace fuselink::testing
