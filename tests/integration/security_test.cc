// Access control with real agents under the built-in default policy: every attack the
// threat model names (docs/security.md) is refused with its code and reason, counted,
// leaves the target's bytes unchanged, and the agent serves on.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/peer/peer_directory.h"
#include "clients/cpp/scrape.h"
#include "fuselink/v1/peer.grpc.pb.h"
#include "gtest/gtest.h"
#include "services/handle_socket/socket.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"
#include "tests/integration/pki.h"

namespace fuselink::testing {
namespace {

constexpr char kR1[] = "spiffe://fuselink/router/r1";
const v1::Layout kLayout = MakeLayout(2, 8, 16 << 10);

// A memfd tensor registered through `stub` (whose certificate makes it the owner),
// with `readers` and `writers` grants.
struct Owned {
  std::unique_ptr<client::HostBuffer> buffer;
  grpc::Status status;
};
Owned Register(v1::Agent::Stub& stub, AgentProcess& agent, const std::string& name,
               uint64_t seed, std::vector<std::string> readers = {},
               std::vector<std::string> writers = {}) {
  Owned out;
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> buffer =
      client::HostBuffer::Create(name, 2 * 8 * (16 << 10));
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  if (!buffer.ok()) return out;
  out.buffer = *std::move(buffer);
  client::FillPattern(out.buffer->span(), seed);
  absl::StatusOr<uint64_t> token =
      services::SendFd(agent.handle_socket(), out.buffer->fd());
  EXPECT_TRUE(token.ok()) << token.status();
  v1::RegisterTensorRequest request;
  request.set_name(name);
  *request.mutable_layout() = kLayout;
  request.mutable_memory()->mutable_host()->set_fd_token(token.ok() ? *token : 0);
  request.mutable_memory()->mutable_host()->set_size_bytes(out.buffer->bytes());
  *request.mutable_readers() = {readers.begin(), readers.end()};
  *request.mutable_writers() = {writers.begin(), writers.end()};
  v1::Tensor tensor;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  out.status = stub.RegisterTensor(&context, request, &tensor);
  return out;
}

grpc::Status Topology(v1::Agent::Stub& stub) {
  v1::Topology topology;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return stub.GetTopology(&context, v1::GetTopologyRequest(), &topology);
}

std::vector<uint32_t> AllBlocks() { return {0, 1, 2, 3, 4, 5, 6, 7}; }

bool SameBytes(const client::HostBuffer& a, const client::HostBuffer& b) {
  return a.bytes() == b.bytes() &&
         std::equal(a.span().begin(), a.span().end(), b.span().begin());
}

double Refusals(AgentProcess& agent, const std::string& reason) {
  absl::StatusOr<std::string> metrics =
      client::HttpGet(agent.metrics_url(), kWaitTimeout);
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  if (!metrics.ok()) return -1;
  absl::StatusOr<double> v = client::MetricValue(
      *metrics, "fuselink_access_refusals_total", {{"reason", reason}});
  return v.ok() ? *v : -1;
}

// node-a, the source of the pulls below, runs what node-b forwards.
std::vector<std::string> WithForwarding(std::vector<std::string> flags) {
  flags.push_back("--accept_forwarded");
  return flags;
}

class SecurityTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartMutualNodes(WithForwarding(AgentTlsFlags(kNodeA, false)),
                                             AgentTlsFlags(kNodeB, false)));
  }
};

TEST_F(SecurityTest, CallersWithoutAGoodCertificateAreRefused) {
  // No certificate: the call arrives and is refused with a reason.
  auto anonymous = v1::Agent::NewStub(ClientChannel(b_->grpc_address(), "", ""));
  EXPECT_TRUE(HasError(Topology(*anonymous), grpc::StatusCode::UNAUTHENTICATED,
                       "NO_CLIENT_CERTIFICATE"));
  auto anonymous_peer = v1::Peer::NewStub(ClientChannel(b_->grpc_address(), "", ""));
  v1::HelloResponse hello;
  grpc::ClientContext context;
  EXPECT_TRUE(HasError(anonymous_peer->Hello(&context, v1::HelloRequest(), &hello),
                       grpc::StatusCode::UNAUTHENTICATED, "NO_CLIENT_CERTIFICATE"));
  EXPECT_EQ(Refusals(*b_, "NO_CLIENT_CERTIFICATE"), 2);
  // A certificate of another CA, and an expired one of ours, fail the TLS handshake:
  // no call reaches the agent.
  TempDir other;
  const std::string foreign = MakeCert("router", "r1", other.path());
  auto stranger = v1::Agent::NewStub(
      ChannelWith(b_->grpc_address(), absl::StrCat(PkiDir(), "/ca.crt"), foreign));
  EXPECT_EQ(Topology(*stranger).error_code(), grpc::StatusCode::UNAVAILABLE);
  const std::string old = MakeCert("router", "expired", "", -1);
  auto expired = v1::Agent::NewStub(
      ChannelWith(b_->grpc_address(), absl::StrCat(PkiDir(), "/ca.crt"), old));
  EXPECT_EQ(Topology(*expired).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(Topology(*b_->StubAs("router", "r1")).ok());
}

TEST_F(SecurityTest, EachRoleDoesOnlyItsOwnCalls) {
  auto router = b_->StubAs("router", "r1");
  auto engine = b_->StubAs("engine", "e1");
  auto peer = b_->StubAs("node", kNodeA);
  auto viewer = b_->StubAs("viewer", "v1");
  // A router does not lend memory.
  Owned by_router = Register(*router, *b_, "kv", 1);
  EXPECT_TRUE(
      HasError(by_router.status, grpc::StatusCode::PERMISSION_DENIED, "ROLE_REQUIRED"));
  // An engine does not move data, nor a viewer, nor a peer through the Agent service.
  Owned kv = Register(*engine, *b_, "kv", 1);
  ASSERT_TRUE(kv.status.ok()) << kv.status.error_message();
  for (v1::Agent::Stub* stub : {engine.get(), viewer.get(), peer.get()}) {
    TransferResult r = RunTransfer(*stub, MakeRequest("not-mine", "kv", {0}, "kv", {1}));
    EXPECT_TRUE(HasError(r.status, grpc::StatusCode::PERMISSION_DENIED, "ROLE_REQUIRED"));
  }
  // A peer's certificate opens only the Peer service.
  EXPECT_TRUE(
      HasError(Topology(*peer), grpc::StatusCode::PERMISSION_DENIED, "ROLE_REQUIRED"));
  EXPECT_TRUE(Topology(*viewer).ok());
  EXPECT_TRUE(Topology(*engine).ok());
  EXPECT_GE(Refusals(*b_, "ROLE_REQUIRED"), 5);
}

TEST_F(SecurityTest, TensorsAreTheirOwnersAndMoveOnlyAsGranted) {
  auto e1a = a_->StubAs("engine", "e1"), e1b = b_->StubAs("engine", "e1");
  auto e2b = b_->StubAs("engine", "e2");
  auto r1 = a_->StubAs("router", "r1"), r2 = a_->StubAs("router", "r2");
  // e1 lends a source on node-a that only router r1 may read, and two targets on
  // node-b: one only r1 may write, one any router may.
  Owned src = Register(*e1a, *a_, "src", 1, {kR1}, {});
  Owned open_src = Register(*e1a, *a_, "open-src", 2);
  Owned dst = Register(*e1b, *b_, "dst", 3, {}, {kR1});
  Owned open_dst = Register(*e1b, *b_, "open-dst", 4);
  for (Owned* o : {&src, &open_src, &dst, &open_dst}) ASSERT_TRUE(o->status.ok());
  const std::vector<uint8_t> dst_before(dst.buffer->span().begin(),
                                        dst.buffer->span().end());

  // Another engine may neither take e1's tensor away nor read or watch it.
  grpc::ClientContext c1;
  v1::UnregisterTensorRequest un;
  un.set_name("dst");
  v1::UnregisterTensorResponse unr;
  EXPECT_TRUE(HasError(e2b->UnregisterTensor(&c1, un, &unr),
                       grpc::StatusCode::PERMISSION_DENIED, "NOT_OWNER"));
  grpc::ClientContext c2;
  v1::GetTensorRequest get;
  get.set_name("dst");
  v1::Tensor tensor;
  EXPECT_TRUE(HasError(e2b->GetTensor(&c2, get, &tensor),
                       grpc::StatusCode::PERMISSION_DENIED, "NOT_OWNER"));
  grpc::ClientContext c3;
  v1::ListTensorsResponse list;
  ASSERT_TRUE(e2b->ListTensors(&c3, v1::ListTensorsRequest(), &list).ok());
  EXPECT_EQ(list.tensors_size(), 0);  // it sees its own only
  // A page at a time, its pages and their tokens name only its own tensors, though
  // e1's "dst" comes before and "open-dst" after in name order; its last page has no
  // token, whatever others' follow.
  Owned mine = Register(*e2b, *b_, "e2-own", 5);
  ASSERT_TRUE(mine.status.ok());
  Owned mine2 = Register(*e2b, *b_, "e2-own2", 6);
  ASSERT_TRUE(mine2.status.ok());
  v1::ListTensorsRequest one;
  one.set_page_size(1);
  grpc::ClientContext c5;
  ASSERT_TRUE(e2b->ListTensors(&c5, one, &list).ok());
  ASSERT_EQ(list.tensors_size(), 1);
  EXPECT_EQ(list.tensors(0).name(), "e2-own");
  EXPECT_EQ(list.next_page_token(), "e2-own");
  one.set_page_token(list.next_page_token());
  grpc::ClientContext c6;
  ASSERT_TRUE(e2b->ListTensors(&c6, one, &list).ok());
  ASSERT_EQ(list.tensors_size(), 1);
  EXPECT_EQ(list.tensors(0).name(), "e2-own2");
  EXPECT_EQ(list.next_page_token(), "");
  grpc::ClientContext c4;
  ASSERT_TRUE(e1b->GetTensor(&c4, get, &tensor).ok());
  EXPECT_EQ(tensor.owner(), "spiffe://fuselink/engine/e1");

  // r2 is no reader of `src`: refused at the source.
  TransferResult r = RunTransfer(
      *r2, MakeRequest("r2-src", "src", AllBlocks(), "open-dst", AllBlocks()));
  EXPECT_TRUE(HasError(r.status, grpc::StatusCode::PERMISSION_DENIED, "TENSOR_ACCESS"));
  // r2 may read `open-src` but is no writer of `dst`: refused by the target, which
  // checks whom the source says it moves for.
  r = RunTransfer(*r2,
                  MakeRequest("r2-dst", "open-src", AllBlocks(), "dst", AllBlocks()));
  EXPECT_TRUE(HasError(r.status, grpc::StatusCode::PERMISSION_DENIED, "TENSOR_ACCESS"));
  EXPECT_TRUE(
      std::equal(dst_before.begin(), dst_before.end(), dst.buffer->span().begin()))
      << "a refused transfer changed the target";
  EXPECT_EQ(Refusals(*a_, "TENSOR_ACCESS"), 1);
  EXPECT_EQ(Refusals(*b_, "TENSOR_ACCESS"), 1);
  // Asked of node-b instead (a pull), node-a still decides by r2's rights: its
  // refusal comes back through node-b, which moved nothing.
  auto r2_at_b = b_->StubAs("router", "r2");
  r = RunTransfer(*r2_at_b,
                  MakeRequest("r2-pull", "src", AllBlocks(), "open-dst", AllBlocks()));
  EXPECT_TRUE(HasError(r.status, grpc::StatusCode::PERMISSION_DENIED, "TENSOR_ACCESS"));
  EXPECT_EQ(Refusals(*a_, "TENSOR_ACCESS"), 2);
  // Only a router may ask node-b to pull, as only one may ask node-a to push.
  r = RunTransfer(
      *e1b, MakeRequest("e1-pull", "open-src", AllBlocks(), "open-dst", AllBlocks()));
  EXPECT_TRUE(HasError(r.status, grpc::StatusCode::PERMISSION_DENIED, "ROLE_REQUIRED"));
  // r1 may pull `src` into `dst` through node-b.
  auto r1_at_b = b_->StubAs("router", "r1");
  r = RunTransfer(*r1_at_b,
                  MakeRequest("r1-pull", "src", AllBlocks(), "dst", AllBlocks()));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_TRUE(SameBytes(*src.buffer, *dst.buffer));
  // Followed through node-b, the pull is r1's alone: node-a finds it for r1 and for
  // nobody else; only a router may ask at all.
  v1::GetTransferRequest pulled;
  pulled.set_request_id("r1-pull");
  pulled.set_source_node(kNodeA);
  v1::TransferStatus pull_status;
  grpc::ClientContext p1, p2, p3;
  ASSERT_TRUE(r1_at_b->GetTransfer(&p1, pulled, &pull_status).ok());
  EXPECT_EQ(pull_status.state(), v1::TRANSFER_STATE_COMPLETED);
  EXPECT_TRUE(HasError(r2_at_b->GetTransfer(&p2, pulled, &pull_status),
                       grpc::StatusCode::NOT_FOUND, "UNKNOWN_TRANSFER"));
  EXPECT_TRUE(HasError(e1b->GetTransfer(&p3, pulled, &pull_status),
                       grpc::StatusCode::PERMISSION_DENIED, "ROLE_REQUIRED"));
  std::fill(dst.buffer->span().begin(), dst.buffer->span().end(), 0);
  // r1 is granted both: the bytes arrive.
  r = RunTransfer(*r1, MakeRequest("r1", "src", AllBlocks(), "dst", AllBlocks()));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_TRUE(SameBytes(*src.buffer, *dst.buffer));
  // A request id names one router's request: another router neither sees nor cancels
  // it by its request id or its transfer id (NOT_FOUND, as if there were none).
  ASSERT_FALSE(r.events.empty());
  for (bool by_request_id : {true, false}) {
    v1::GetTransferRequest get_t;
    v1::CancelTransferRequest cancel_t;
    if (by_request_id) {
      get_t.set_request_id("r1");
      cancel_t.set_request_id("r1");
    } else {
      get_t.set_transfer_id(r.events[0].transfer_id());
      cancel_t.set_transfer_id(r.events[0].transfer_id());
    }
    v1::TransferStatus status;
    grpc::ClientContext g1, g2, g3;
    EXPECT_TRUE(HasError(r2->GetTransfer(&g1, get_t, &status),
                         grpc::StatusCode::NOT_FOUND, "UNKNOWN_TRANSFER"));
    EXPECT_TRUE(HasError(r2->CancelTransfer(&g2, cancel_t, &status),
                         grpc::StatusCode::NOT_FOUND, "UNKNOWN_TRANSFER"));
    EXPECT_TRUE(r1->GetTransfer(&g3, get_t, &status).ok());
  }
  // Nor does its own use of the same id collide with r1's.
  r = RunTransfer(*r2,
                  MakeRequest("r1", "open-src", AllBlocks(), "open-dst", AllBlocks()));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
}

TEST_F(SecurityTest, APeerSpeaksOnlyForItsOwnNode) {
  auto x = v1::Peer::NewStub(ClientChannel(b_->grpc_address(), "node", "node-x"));
  v1::HelloRequest hello;
  hello.set_version(peer::kPeerProtocolVersion);
  hello.mutable_topology()->set_node(kNodeA);  // posing as node-a
  hello.set_fabric_key(std::string(32, 'k'));
  v1::HelloResponse hello_response;
  grpc::ClientContext c1;
  EXPECT_TRUE(HasError(x->Hello(&c1, hello, &hello_response),
                       grpc::StatusCode::PERMISSION_DENIED, "NODE_MISMATCH"));
  EXPECT_TRUE(hello_response.fabric_key().empty());
  v1::PrepareIncomingRequest prepare;
  prepare.set_source_node(kNodeA);
  prepare.set_tensor("kv");
  v1::PrepareIncomingResponse prepared;
  grpc::ClientContext c2;
  EXPECT_TRUE(HasError(x->PrepareIncoming(&c2, prepare, &prepared),
                       grpc::StatusCode::PERMISSION_DENIED, "NODE_MISMATCH"));
  v1::GetIncomingRequest query;
  query.set_source_node(kNodeA);
  v1::IncomingState state;
  grpc::ClientContext c3;
  EXPECT_TRUE(HasError(x->GetIncoming(&c3, query, &state),
                       grpc::StatusCode::PERMISSION_DENIED, "NODE_MISMATCH"));
  // Nor may it forward a transfer as node-a, for any requester.
  v1::ForwardTransferRequest forward;
  forward.set_from_node(kNodeA);
  forward.set_requester("spiffe://fuselink/router/r1");
  *forward.mutable_request() = MakeRequest("x", "kv", {0}, "kv", {0});
  grpc::ClientContext c5;
  v1::TransferEvent event;
  std::unique_ptr<grpc::ClientReader<v1::TransferEvent>> forwarded =
      x->ForwardTransfer(&c5, forward);
  EXPECT_FALSE(forwarded->Read(&event));
  EXPECT_TRUE(HasError(forwarded->Finish(), grpc::StatusCode::PERMISSION_DENIED,
                       "NODE_MISMATCH"));
  // Nor ask about, or cancel, a transfer as node-a.
  v1::ForwardControlRequest control;
  control.set_from_node(kNodeA);
  control.set_requester("spiffe://fuselink/router/r1");
  control.mutable_cancel()->set_request_id("x");
  v1::TransferStatus controlled;
  grpc::ClientContext c6;
  EXPECT_TRUE(HasError(x->ForwardControl(&c6, control, &controlled),
                       grpc::StatusCode::PERMISSION_DENIED, "NODE_MISMATCH"));
  // A router's certificate is no peer's.
  auto router = v1::Peer::NewStub(ClientChannel(b_->grpc_address(), "router", "r1"));
  grpc::ClientContext c4;
  EXPECT_TRUE(HasError(router->PrepareIncoming(&c4, prepare, &prepared),
                       grpc::StatusCode::PERMISSION_DENIED, "ROLE_REQUIRED"));
  EXPECT_EQ(Refusals(*b_, "NODE_MISMATCH"), 5);
  EXPECT_TRUE(Serves(*b_));
}

// node-a runs forwarded calls; one from node-b that names none of the four requests
// is refused with its reason, and node-a serves on.
TEST_F(SecurityTest, AForwardedCallNamingNoRequestIsMalformed) {
  auto b_at_a = v1::Peer::NewStub(ClientChannel(a_->grpc_address(), "node", kNodeB));
  v1::ForwardControlRequest empty;
  empty.set_from_node(kNodeB);
  empty.set_requester("spiffe://fuselink/router/r1");
  v1::TransferStatus status;
  grpc::ClientContext context;
  EXPECT_TRUE(HasError(b_at_a->ForwardControl(&context, empty, &status),
                       grpc::StatusCode::INVALID_ARGUMENT, "MALFORMED_REQUEST"));
  EXPECT_TRUE(Serves(*a_));
}

// Bad security input is refused with its reason, and the agent serves on: a grant
// naming no role, a Hello whose fabric key is not 32 bytes.
TEST_F(SecurityTest, MalformedGrantsAndFabricKeysAreRefused) {
  auto engine = b_->StubAs("engine", "e1");
  Owned bad = Register(*engine, *b_, "kv", 1, {"role:admin"});
  EXPECT_TRUE(HasError(bad.status, grpc::StatusCode::INVALID_ARGUMENT, "BAD_GRANT"));
  bad = Register(*engine, *b_, "kv", 1, {}, {"two words"});
  EXPECT_TRUE(HasError(bad.status, grpc::StatusCode::INVALID_ARGUMENT, "BAD_GRANT"));
  auto peer = v1::Peer::NewStub(ClientChannel(b_->grpc_address(), "node", "node-c"));
  v1::HelloRequest hello;
  hello.set_version(peer::kPeerProtocolVersion);
  hello.mutable_topology()->set_node("node-c");
  hello.set_fabric_key("short");
  v1::HelloResponse response;
  grpc::ClientContext context;
  EXPECT_TRUE(HasError(peer->Hello(&context, hello, &response),
                       grpc::StatusCode::INVALID_ARGUMENT, "PROTOCOL"));
  EXPECT_TRUE(response.fabric_key().empty());
  EXPECT_TRUE(Register(*engine, *b_, "kv", 1).status.ok());  // serves on
}

// GPU memory by CUDA IPC handle is not lent by gRPC alone: 64 handle bytes from an
// engine certificate, on any host, are refused unless a token from this node's handle
// socket (a local process whose credentials the agent read) comes with them. Nothing
// is registered; the agent serves on. (Two owners never share one import:
// ipc_imports_test, with no GPU needed.)
TEST_F(SecurityTest, AnEngineCertificateAloneCannotLendGpuMemoryByIpcHandle) {
  auto engine = b_->StubAs("engine", "e1");
  v1::RegisterTensorRequest request;
  request.set_name("borrowed");
  *request.mutable_layout() = kLayout;
  v1::CudaIpcMemory* ipc = request.mutable_memory()->mutable_cuda_ipc();
  ipc->set_handle(std::string(64, '\x33'));
  ipc->set_size_bytes(2 * 8 * (16 << 10));
  v1::Tensor tensor;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  EXPECT_TRUE(HasError(engine->RegisterTensor(&context, request, &tensor),
                       grpc::StatusCode::PERMISSION_DENIED, "OWNER_TOKEN_REQUIRED"));
  v1::GetTensorRequest get;
  get.set_name("borrowed");
  grpc::ClientContext get_context;
  get_context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  EXPECT_TRUE(HasError(engine->GetTensor(&get_context, get, &tensor),
                       grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  EXPECT_TRUE(Register(*engine, *b_, "kv", 1).status.ok());  // serves on
}

// An agent does not start on TLS files it cannot use, nor on contradictory flags; it
// says why.
TEST_F(SecurityTest, AgentRefusesUnusableTlsFlags) {
  const std::string stem = MakeCert("node", "node-x");
  const std::vector<std::vector<std::string>> refused = {
      {"--tls_cert=/nonexistent.crt", absl::StrCat("--tls_key=", stem, ".key"),
       absl::StrCat("--tls_ca=", PkiDir(), "/ca.crt")},
      {absl::StrCat("--tls_cert=", stem, ".crt"),
       absl::StrCat("--tls_key=", stem, ".key"),
       "--tls_ca=/dev/null"},  // a CA file that holds no PEM
      {absl::StrCat("--tls_cert=", stem, ".crt"), "--plaintext"},
  };
  const std::vector<std::string> why = {"BAD_TLS_FILES", "BAD_TLS_FILES", "contradict"};
  for (size_t i = 0; i < refused.size(); ++i) {
    absl::StatusOr<std::unique_ptr<AgentProcess>> agent =
        AgentProcess::Start(dir_.path(), "node-x", refused[i]);
    ASSERT_FALSE(agent.ok()) << i;
    EXPECT_TRUE(absl::StrContains(agent.status().message(), why[i]))
        << i << ": " << agent.status().message();
  }
}

// Reads the serial of the certificate the agent at `address` serves.
std::string ServedSerial(const std::string& address) {
  const std::string command =
      absl::StrCat("openssl s_client -connect ", address,
                   " </dev/null 2>/dev/null | openssl x509 -noout -serial 2>/dev/null");
  std::string out;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[256];
    while (fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
    pclose(pipe);
  }
  return out;
}

TEST_F(SecurityTest, CertificatesRotateUnderARunningTransfer) {
  auto engine_a = a_->StubAs("engine", "e1"), engine_b = b_->StubAs("engine", "e1");
  auto router = a_->StubAs("router", "r1");
  // Big enough to be caught in flight.
  const v1::Layout big = MakeLayout(4, 64, 1 << 20);
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> src_buffer =
      client::HostBuffer::Create("src", 256 << 20);
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> dst_buffer =
      client::HostBuffer::Create("dst", 256 << 20);
  ASSERT_TRUE(src_buffer.ok() && dst_buffer.ok());
  client::FillPattern((*src_buffer)->span(), 7);
  for (auto [agent, stub, buffer] :
       {std::tuple{a_.get(), engine_a.get(), src_buffer->get()},
        std::tuple{b_.get(), engine_b.get(), dst_buffer->get()}}) {
    absl::StatusOr<uint64_t> token =
        services::SendFd(agent->handle_socket(), buffer->fd());
    ASSERT_TRUE(token.ok());
    v1::RegisterTensorRequest request;
    request.set_name(agent == a_.get() ? "src" : "dst");
    *request.mutable_layout() = big;
    request.mutable_memory()->mutable_host()->set_fd_token(*token);
    request.mutable_memory()->mutable_host()->set_size_bytes(buffer->bytes());
    v1::Tensor tensor;
    grpc::ClientContext context;
    ASSERT_TRUE(stub->RegisterTensor(&context, request, &tensor).ok());
  }
  std::vector<uint32_t> blocks(64);
  for (uint32_t i = 0; i < 64; ++i) blocks[i] = i;
  const std::string serial_before = ServedSerial(b_->grpc_address());
  ASSERT_FALSE(serial_before.empty());

  TransferCall call(*router, MakeRequest("rotating", "src", blocks, "dst", blocks));
  ASSERT_TRUE(call.WaitUntilMoving());
  b_->Pause();  // holds the transfer in flight while the certificates change
  ASSERT_FALSE(call.WaitForEvent(
      [](const v1::TransferEvent& e) { return e.has_completed() || e.has_failed(); },
      absl::Milliseconds(300)))
      << "the transfer ended before the rotation: make it bigger";
  for (const char* node : {kNodeA, kNodeB}) {
    const std::string stem = absl::StrCat(PkiDir(), "/node-", node);
    unlink((stem + ".crt").c_str());
    MakeCert("node", node);  // a new certificate and key, same identity and CA
  }
  absl::SleepFor(absl::Seconds(3));  // past --tls_refresh_s=1
  b_->Resume();
  TransferResult done = call.Finish();
  ASSERT_TRUE(done.status.ok()) << done.status.error_message();
  EXPECT_TRUE(SameBytes(**src_buffer, **dst_buffer));
  // New connections see the new certificate, and peers still trust each other. The
  // agent was stopped meanwhile, so its watchers look again only now: the new files
  // are vetted and staged at its next look, and gRPC takes the staged copy at its
  // own next look (tls_stage.h), within two --tls_refresh_s=1 of the resume.
  const absl::Time deadline = absl::Now() + kWaitTimeout;
  std::string serial_after = ServedSerial(b_->grpc_address());
  while (serial_after == serial_before && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(200));
    serial_after = ServedSerial(b_->grpc_address());
  }
  EXPECT_NE(serial_after, serial_before);
  TransferResult again =
      RunTransfer(*router, MakeRequest("after-rotation", "src", blocks, "dst", blocks));
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
}

double TlsCounter(AgentProcess& agent, const std::string& name) {
  absl::StatusOr<std::string> metrics =
      client::HttpGet(agent.metrics_url(), kWaitTimeout);
  if (!metrics.ok()) return -1;
  absl::StatusOr<double> v = client::MetricValue(*metrics, name);
  return v.ok() ? *v : -1;
}

// Polls `counter` of `agent` until it reaches `at_least`, for up to kWaitTimeout.
bool CounterReaches(AgentProcess& agent, const std::string& counter, double at_least) {
  const absl::Time deadline = absl::Now() + kWaitTimeout;
  while (TlsCounter(agent, counter) < at_least) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return true;
}

// A certificate file overwritten with garbage: the agent says why in one counter (and
// one log line), keeps serving new connections with the last good pair, and takes a
// good file again once it is back.
TEST_F(SecurityTest, AGarbledCertificateKeepsTheLastGoodPairServing) {
  const std::string cert = absl::StrCat(PkiDir(), "/node-", kNodeB, ".crt");
  std::string good;
  {
    std::ifstream in(cert);
    std::stringstream text;
    text << in.rdbuf();
    good = text.str();
  }
  ASSERT_FALSE(good.empty());
  const std::string serial_before = ServedSerial(b_->grpc_address());
  ASSERT_FALSE(serial_before.empty());
  ASSERT_EQ(TlsCounter(*b_, "fuselink_tls_reload_failures_total"), 0);
  const double reloads = TlsCounter(*b_, "fuselink_tls_reloads_total");
  ASSERT_GE(reloads, 0);
  // Whole files renamed into place, as cert-manager does: one change each.
  auto write = [&](const std::string& text) {
    const std::string temp = cert + ".new";
    {
      std::ofstream out(temp, std::ios::trunc);
      out << text;
    }
    ASSERT_EQ(rename(temp.c_str(), cert.c_str()), 0);
  };
  write("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n");
  EXPECT_TRUE(CounterReaches(*b_, "fuselink_tls_reload_failures_total", 1));
  // New connections: the certificate served is still the good one, and calls pass.
  EXPECT_EQ(ServedSerial(b_->grpc_address()), serial_before);
  auto viewer = b_->StubAs("viewer", "v1");
  EXPECT_TRUE(Topology(*viewer).ok());
  EXPECT_EQ(TlsCounter(*b_, "fuselink_tls_reload_failures_total"), 1);  // once per change
  // The good certificate back: staged again, and served.
  write(good);
  EXPECT_TRUE(CounterReaches(*b_, "fuselink_tls_reloads_total", reloads + 1));
  auto again = b_->StubAs("viewer", "v2");
  EXPECT_TRUE(Topology(*again).ok());
}

}  // namespace
}  // namespace fuselink::testing
