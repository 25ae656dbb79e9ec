// A handler whose work blocks answers from a KeyedPool
// (services/grpc/answer_off_thread.h), as Peer.PrepareIncoming and Agent.RegisterTensor
// do: over a real gRPC server on loopback, a source whose prepares hang holds its lane's
// share of the pool and no gRPC thread; its calls past the bound per source, and anyone's
// past the bound in all, are refused at once with RESOURCE_EXHAUSTED and the pool's
// reason; other calls (Hello, the health check) are answered all the while; every call
// taken is answered.
#include "services/grpc/answer_off_thread.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"
#include "fuselink/v1/peer.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"

namespace fuselink::services {
namespace {

// Long enough for a loaded machine; waits end as soon as their condition holds.
constexpr absl::Duration kWaitTimeout = absl::Seconds(20);

// A Peer service whose PrepareIncoming work waits until the test releases it.
class HeldPeer final : public v1::Peer::CallbackService {
 public:
  explicit HeldPeer(transfer::KeyedPool* pool) : pool_(pool) {}

  grpc::ServerUnaryReactor* Hello(grpc::CallbackServerContext* context,
                                  const v1::HelloRequest* request,
                                  v1::HelloResponse* response) override {
    response->set_version(request->version());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* PrepareIncoming(
      grpc::CallbackServerContext* context, const v1::PrepareIncomingRequest* request,
      v1::PrepareIncomingResponse* response) override {
    return AnswerOffThread(*pool_, request->source_node(), [this, response] {
      absl::MutexLock lock(&mu_);
      ++started_;
      auto released = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return released_; };
      mu_.Await(absl::Condition(&released));
      response->set_slot(7);
      return absl::OkStatus();
    });
  }

  bool WaitStarted(int count) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return started_ >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), kWaitTimeout);
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }

 private:
  transfer::KeyedPool* const pool_;
  absl::Mutex mu_;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// One PrepareIncoming in flight from the client.
struct Call {
  grpc::ClientContext context;
  v1::PrepareIncomingRequest request;
  v1::PrepareIncomingResponse response;
  grpc::Status status;
  absl::Notification done;
};

class AnswerOffThreadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    transfer::KeyedPoolOptions o;
    o.name = "PrepareIncoming calls from node";
    o.reason = reasons::kIncomingPreparesBusy;
    o.threads = 2;
    o.running_per_key = 2;
    o.pending_per_key = 2;
    o.pending_total = 4;
    pool_ = std::make_unique<transfer::KeyedPool>(o);
    service_ = std::make_unique<HeldPeer>(pool_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Peer::NewStub(channel_);
  }
  void TearDown() override {
    service_->Release();
    for (const auto& call : calls_) {
      EXPECT_TRUE(call->done.WaitForNotificationWithTimeout(kWaitTimeout));
    }
    server_->Shutdown();  // returns once every call taken was answered
    pool_->Stop(/*run_queued=*/true);
  }

  Call* Prepare(const std::string& source_node) {
    calls_.push_back(std::make_unique<Call>());
    Call* call = calls_.back().get();
    call->request.set_source_node(source_node);
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + 2 * kWaitTimeout));
    stub_->async()->PrepareIncoming(&call->context, &call->request, &call->response,
                                    [call](grpc::Status status) {
                                      call->status = std::move(status);
                                      call->done.Notify();
                                    });
    return call;
  }
  // Until the pool holds `count` calls, queued or running.
  bool AwaitPending(size_t count) {
    const absl::Time until = absl::Now() + kWaitTimeout;
    while (pool_->pending() < count) {
      if (absl::Now() > until) return false;
      std::this_thread::yield();
    }
    return true;
  }
  // The refusal `call` got, once it came.
  static absl::Status Refusal(Call* call) {
    EXPECT_TRUE(call->done.WaitForNotificationWithTimeout(kWaitTimeout));
    return FromGrpcStatus(call->status);
  }
  grpc::Status Hello() {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWaitTimeout));
    v1::HelloRequest request;
    request.set_version(3);
    v1::HelloResponse response;
    return stub_->Hello(&context, request, &response);
  }
  // grpc.health.v1.Health/Check with an empty request (every service): the status.
  grpc::Status HealthCheck() {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kWaitTimeout));
    grpc::Slice empty("");  // HealthCheckRequest{}: no bytes, but a message
    grpc::ByteBuffer request(&empty, 1), response;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                   &request, &response, [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(kWaitTimeout));
    return status;
  }

  std::unique_ptr<transfer::KeyedPool> pool_;
  std::unique_ptr<HeldPeer> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Peer::Stub> stub_;
  std::vector<std::unique_ptr<Call>> calls_;
};

TEST_F(AnswerOffThreadTest, ASourcePastItsBoundIsRefusedWhileOtherCallsAreAnswered) {
  Prepare("node-x");
  Prepare("node-x");
  ASSERT_TRUE(service_->WaitStarted(2));  // both of the pool's threads held
  const absl::Status refused = Refusal(Prepare("node-x"));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(ReasonOf(refused), "INCOMING_PREPARES_BUSY");
  EXPECT_EQ(pool_->refused(), 1u);
  // Calls that do not wait on the pool are answered all the while.
  EXPECT_TRUE(Hello().ok());
  EXPECT_TRUE(HealthCheck().ok());
}

TEST_F(AnswerOffThreadTest, PastTheBoundInAllEveryoneIsRefusedAndTheQueuedAreAnswered) {
  Prepare("node-x");
  Prepare("node-x");
  ASSERT_TRUE(service_->WaitStarted(2));
  Call* queued_y = Prepare("node-y");
  Call* queued_z = Prepare("node-z");
  ASSERT_TRUE(AwaitPending(4));  // both reached the server, in whichever order
  // Four queued or running: a fifth, from a source with none, is refused.
  const absl::Status refused = Refusal(Prepare("node-w"));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(ReasonOf(refused), "INCOMING_PREPARES_BUSY");
  EXPECT_TRUE(Hello().ok());
  service_->Release();
  for (Call* call : {queued_y, queued_z}) {
    ASSERT_TRUE(call->done.WaitForNotificationWithTimeout(kWaitTimeout));
    EXPECT_TRUE(call->status.ok()) << call->status.error_message();
    EXPECT_EQ(call->response.slot(), 7u);
  }
}

}  // namespace
}  // namespace fuselink::services
