// The verbs control connection's bounds on real RDMA devices (verbs/link.h): a peer
// that finishes the real handshake and then stops midway through a control frame (a
// source's, or a target's WINDOW_ADD in its records) has its link closed within the
// stall bound, while an idle link stays; and a peer past its share of accepted
// control connections is refused, saying why, while other peers connect. Raw sockets
// play the misbehaving side. Times are printed as "bench:" lines. The fixture is in
// verbs_fabric_test_util.h.
#include <poll.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/handshake.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/verbs/device.h"
#include "agent/fabric/verbs/fabric.h"
#include "agent/fabric/verbs/wire.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"
#include "tests/rdma/verbs_fabric_test_util.h"

namespace fuselink::fabric {
namespace {

namespace vwire = verbs::wire;
using testing::Rails;
using testing::VerbsFabricTest;

constexpr int kStallMs = 1000;
// What a loaded VM may add to the bound's own 1.25x.
constexpr absl::Duration kSlack = absl::Seconds(2);
const absl::Duration kLatest = absl::Milliseconds(kStallMs * 5 / 4) + kSlack;

absl::Status Send(int fd, const void* data, size_t bytes) {
  return testing::SendRaw(fd, data, bytes);
}

absl::StatusOr<vwire::Decoded> ReadFrame(int fd) {
  vwire::Frame frame;
  FL_RETURN_IF_ERROR(RecvAll(fd, frame.data(), frame.size()));
  return vwire::DecodeFrame(frame);
}

// A control connection to b's NIC 0 played by hand under a's name and key, from a's
// end of the rail: HELLO offering one QP that does not exist (b connects its QP to it
// all the same), CHALLENGE, PROOF. Returns b's answer: its HELLO, read with the QP
// records and the windows up to READY (nullopt), or its REFUSE.
absl::StatusOr<std::optional<vwire::Refuse>> ProveAsA(testing::KeyRing& keys, int fd) {
  vwire::Hello hello{.nic = 0, .mtu = IBV_MTU_1024, .name = "a", .qps = {}};
  hello.qps = {{.qpn = 1234, .psn = 1}};
  FL_ASSIGN_OR_RETURN(verbs::NicBinding a_end, verbs::BindAddress(Rails()[0].a));
  std::memcpy(hello.gid.data(), a_end.gid.raw, vwire::kGidBytes);
  FL_ASSIGN_OR_RETURN(hello.client_nonce, handshake::NewNonce());
  FL_ASSIGN_OR_RETURN(const std::string hello_bytes, vwire::EncodeHello(hello));
  FL_RETURN_IF_ERROR(Send(fd, hello_bytes.data(), hello_bytes.size()));
  FL_ASSIGN_OR_RETURN(vwire::Decoded first, ReadFrame(fd));
  const auto* challenge = std::get_if<vwire::Challenge>(&first);
  if (challenge == nullptr) return absl::InternalError("no CHALLENGE");
  const std::optional<SessionKey> key = keys.For("a")->FindConnectKey("b");
  if (!key.has_value()) return absl::InternalError("a holds no key for b");
  FL_ASSIGN_OR_RETURN(const handshake::Mac mac,
                      handshake::ComputeMac(*key, handshake::Side::kConnector,
                                            {.connector = "a",
                                             .acceptor = "b",
                                             .nic = 0,
                                             .client_nonce = hello.client_nonce,
                                             .server_nonce = challenge->server_nonce}));
  const vwire::Frame proof = vwire::EncodeProof({.mac = mac});
  FL_RETURN_IF_ERROR(Send(fd, proof.data(), proof.size()));
  FL_ASSIGN_OR_RETURN(vwire::Decoded reply, ReadFrame(fd));
  if (const auto* refuse = std::get_if<vwire::Refuse>(&reply)) return *refuse;
  const auto* header = std::get_if<vwire::HelloHeader>(&reply);
  if (header == nullptr) return absl::InternalError("no HELLO reply");
  std::vector<uint8_t> records(size_t{header->qp_count} * vwire::kQpInfoBytes);
  FL_RETURN_IF_ERROR(RecvAll(fd, records.data(), records.size()));
  while (true) {
    FL_ASSIGN_OR_RETURN(vwire::Decoded frame, ReadFrame(fd));
    if (std::holds_alternative<vwire::Ready>(frame)) return std::nullopt;
    if (!std::holds_alternative<vwire::WindowAdd>(frame)) {
      return absl::InternalError("expected READY");  // the tests open no window first
    }
  }
}

absl::StatusOr<UniqueFd> RawFromA(const Fabric& a, const Fabric& b) {
  FL_ASSIGN_OR_RETURN(SocketAddress from,
                      ParseSocketAddress(a.endpoints()[0].address, 0));
  FL_ASSIGN_OR_RETURN(SocketAddress to, ParseSocketAddress(b.endpoints()[0].address,
                                                           b.endpoints()[0].port));
  return ConnectFrom(from, to, 5000);
}

// Waits for the peer to close `fd`; how long it took from `since`, or nullopt.
std::optional<absl::Duration> ClosedAfter(int fd, absl::Time since) {
  if (!testing::WaitUntilClosed(fd)) return std::nullopt;
  return absl::Now() - since;
}

class VerbsBoundsTest : public VerbsFabricTest {
 protected:
  // After the raw link is gone: a connects to the real b and a write lands.
  void ExpectAWriteLands() {
    ConnectAB();
    if (HasFatalFailure()) return;
    std::vector<uint8_t> target(4096, testing::kUntouched);
    std::vector<uint8_t> source(16, 'S');
    const WindowKey window = Window(Region(*b_, target), "a", {{0, target.size()}});
    ASSERT_TRUE(Post(0, {.local_key = Region(*a_, source),
                         .remote_key = window,
                         .remote_offset = 64,
                         .bytes = 16,
                         .wr_id = 99})
                    .ok());
    std::optional<Completion> done = CompletionOf(99);
    ASSERT_TRUE(done.has_value());
    EXPECT_TRUE(done->status.ok()) << done->status;
    EXPECT_EQ(std::memcmp(&target[64], source.data(), 16), 0);
    EXPECT_EQ(target[0], testing::kUntouched);
  }
};

// A source that proved itself, idled (no bound), then sent 20 bytes of a frame and
// stopped: b closes its link within the stall bound and counts it; a real a then
// connects and writes.
TEST_F(VerbsBoundsTest, ASourceStoppedMidFrameIsClosedWithinTheStallBound) {
  FL_MAKE_UNCONNECTED(1, 1, [](VerbsFabricOptions& b) { b.stall_timeout_ms = kStallMs; });
  absl::StatusOr<UniqueFd> raw = RawFromA(*a_, *b_);
  ASSERT_TRUE(raw.ok()) << raw.status();
  absl::StatusOr<std::optional<vwire::Refuse>> shaken = ProveAsA(keys_, raw->get());
  ASSERT_TRUE(shaken.ok()) << shaken.status();
  ASSERT_FALSE(shaken->has_value()) << "refused";
  absl::SleepFor(absl::Milliseconds(2 * kStallMs));  // idle between frames: no bound
  pollfd idle{.fd = raw->get(), .events = POLLIN, .revents = 0};
  EXPECT_EQ(poll(&idle, 1, 0), 0) << "b closed an idle link";
  EXPECT_TRUE(b_->FindPeer("a").has_value());
  EXPECT_EQ(b_->counters(0).stalled_connections, 0u);

  const vwire::Frame ack = vwire::EncodeAck({.seq = 1});
  ASSERT_TRUE(Send(raw->get(), ack.data(), 20).ok());
  const absl::Time stopped = absl::Now();
  std::optional<absl::Duration> took = ClosedAfter(raw->get(), stopped);
  ASSERT_TRUE(took.has_value()) << "b never closed the stalled link";
  std::printf(
      "bench: verbs control frame stopped after 20 of 64 bytes, closed after "
      "%.0f ms (stall_timeout_ms %d)\n",
      absl::ToDoubleMilliseconds(*took), kStallMs);
  EXPECT_GE(*took, absl::Milliseconds(kStallMs * 3 / 4));
  EXPECT_LE(*took, kLatest);
  EXPECT_EQ(b_->counters(0).stalled_connections, 1u);
  EXPECT_EQ(b_->counters(0).auth_failures, 0u);
  ExpectAWriteLands();
}

// A target that answers the real handshake by hand, idles, then sends a WINDOW_ADD
// with one of its two records and stops: a closes the link (its QPs, the peer lost)
// within the stall bound and counts it; a then connects to the real b and writes.
TEST_F(VerbsBoundsTest, ATargetStoppedInAWindowAddsRecordsIsClosedWithinTheBound) {
  FL_MAKE_UNCONNECTED(1, 1, nullptr,
                      [](VerbsFabricOptions& a) { a.stall_timeout_ms = kStallMs; });
  const std::string address = Rails()[0].b;
  absl::StatusOr<verbs::NicBinding> binding = verbs::BindAddress(address);
  ASSERT_TRUE(binding.ok()) << binding.status();
  absl::StatusOr<SocketAddress> local = ParseSocketAddress(address, 0);
  ASSERT_TRUE(local.ok());
  absl::StatusOr<UniqueFd> listener = Listen(*local);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<SocketAddress> bound = LocalAddress(listener->get());
  ASSERT_TRUE(bound.ok());

  absl::Time stopped;
  UniqueFd raw;
  std::thread target([&] {
    pollfd waiting{.fd = listener->get(), .events = POLLIN, .revents = 0};
    ASSERT_EQ(poll(&waiting, 1, 10'000), 1) << "a never connected";
    absl::StatusOr<UniqueFd> accepted = Accept(listener->get());
    ASSERT_TRUE(accepted.ok()) << accepted.status();
    raw = *std::move(accepted);
    const int fd = raw.get();
    vwire::Frame frame;
    ASSERT_TRUE(RecvAll(fd, frame.data(), frame.size()).ok());
    absl::StatusOr<vwire::Decoded> decoded = vwire::DecodeFrame(frame);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    const auto header = std::get<vwire::HelloHeader>(*decoded);
    std::vector<uint8_t> rest(header.name_bytes + header.qp_count * vwire::kQpInfoBytes);
    ASSERT_TRUE(RecvAll(fd, rest.data(), rest.size()).ok());
    handshake::Transcript transcript{.connector = "a",
                                     .acceptor = "b",
                                     .nic = 0,
                                     .client_nonce = header.client_nonce,
                                     .server_nonce = *handshake::NewNonce()};
    absl::StatusOr<SessionKey> key = handshake::AcceptorKeyFor(*keys_.For("b"), "a");
    ASSERT_TRUE(key.ok()) << key.status();
    const vwire::Frame challenge = vwire::EncodeChallenge(
        {.server_nonce = transcript.server_nonce,
         .mac = *handshake::ComputeMac(*key, handshake::Side::kAcceptor, transcript)});
    ASSERT_TRUE(Send(fd, challenge.data(), challenge.size()).ok());
    ASSERT_TRUE(RecvAll(fd, frame.data(), frame.size()).ok());  // PROOF
    vwire::Hello reply{.nic = 0, .mtu = header.mtu, .name = "", .qps = {}};
    for (uint32_t i = 0; i < header.qp_count; ++i) reply.qps.push_back({4321 + i, 1});
    std::memcpy(reply.gid.data(), binding->gid.raw, vwire::kGidBytes);
    const std::string reply_bytes = *vwire::EncodeHello(reply);
    ASSERT_TRUE(Send(fd, reply_bytes.data(), reply_bytes.size()).ok());
    const vwire::Frame ready = vwire::EncodeReady();
    ASSERT_TRUE(Send(fd, ready.data(), ready.size()).ok());
    absl::SleepFor(absl::Milliseconds(2 * kStallMs));  // idle between frames: no bound
    const std::vector<vwire::WindowRecord> records = {
        {.offset = 0, .bytes = 4096, .rkey = 1},
        {.offset = 4096, .bytes = 4096, .rkey = 2}};
    const std::string add = *vwire::EncodeWindowAdd(7, 0, 1, records);
    ASSERT_TRUE(
        Send(fd, add.data(), vwire::kFrameBytes + vwire::kWindowRecordBytes).ok());
    stopped = absl::Now();
  });
  absl::StatusOr<PeerId> fake =
      a_->Connect("b", {{.nic = 0, .address = address, .port = bound->port()}});
  ASSERT_TRUE(fake.ok()) << fake.status();
  target.join();
  if (HasFatalFailure()) return;
  EXPECT_EQ(a_events_.peers_lost().size(), 0u) << "a closed an idle link";
  std::optional<absl::Duration> took = ClosedAfter(raw.get(), stopped);
  ASSERT_TRUE(took.has_value()) << "a never closed the stalled link";
  std::printf(
      "bench: verbs WINDOW_ADD stopped after 1 of 2 records, closed after "
      "%.0f ms (stall_timeout_ms %d)\n",
      absl::ToDoubleMilliseconds(*took), kStallMs);
  EXPECT_GE(*took, absl::Milliseconds(kStallMs * 3 / 4));
  EXPECT_LE(*took, kLatest);
  ASSERT_TRUE(a_events_.WaitForPeersLost(1));
  EXPECT_NE(a_events_.peers_lost()[0].second.message().find("begun frame"),
            std::string::npos)
      << a_events_.peers_lost()[0].second;
  EXPECT_EQ(a_->counters(0).stalled_connections, 1u);
  ExpectAWriteLands();
}

VerbsFabricOptions ThirdOptions(const std::string& name, testing::KeyRing& keys) {
  VerbsFabricOptions options;
  options.keys = keys.For(name);
  options.node_name = name;
  options.nics.push_back({.nic = 0, .address = Rails()[0].a});
  options.qps_per_peer_nic = 1;
  return options;
}

// b lets a peer hold one accepted control connection: a's second (by hand) is refused
// after its PROOF with a REFUSE that says why, before it costs a QP, and counted; a
// second fabric under a's name fails its Connect RESOURCE_EXHAUSTED with the reason;
// c, another peer, connects, and a's first link still carries writes.
TEST_F(VerbsBoundsTest, ControlConnectionsPastAPeersShareAreRefused) {
  FL_MAKE(1, 1, [](VerbsFabricOptions& b) { b.max_links_per_peer = 1; });
  absl::StatusOr<UniqueFd> raw = RawFromA(*a_, *b_);
  ASSERT_TRUE(raw.ok()) << raw.status();
  absl::StatusOr<std::optional<vwire::Refuse>> shaken = ProveAsA(keys_, raw->get());
  ASSERT_TRUE(shaken.ok()) << shaken.status();
  ASSERT_TRUE(shaken->has_value()) << "b took a link past a's share";
  EXPECT_EQ((*shaken)->code, absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*shaken)->why, wire::ConnectionRefusal::kPeerConnections);
  EXPECT_TRUE(testing::WaitUntilClosed(raw->get()));
  EXPECT_EQ(b_->counters(0).peer_connection_refusals, 1u);
  EXPECT_EQ(b_->counters(0).auth_failures, 0u);

  testing::RecordingHandler again_events;
  auto again = CreateVerbsFabric(ThirdOptions("a", keys_), &again_events);
  ASSERT_TRUE(again.ok()) << again.status();
  absl::StatusOr<PeerId> refused = (*again)->Connect("b", b_->endpoints());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  EXPECT_EQ(ReasonOf(refused.status()), reasons::kFabricPeerConnections)
      << refused.status();
  EXPECT_EQ(b_->counters(0).peer_connection_refusals, 2u);

  testing::RecordingHandler c_events;
  auto c = CreateVerbsFabric(ThirdOptions("c", keys_), &c_events);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<PeerId> c_peer = (*c)->Connect("b", b_->endpoints());
  EXPECT_TRUE(c_peer.ok()) << c_peer.status();
  EXPECT_TRUE(b_->FindPeer("c").has_value());

  std::vector<uint8_t> target(4096, testing::kUntouched);
  std::vector<uint8_t> source(16, 'S');
  const WindowKey window = Window(Region(*b_, target), "a", {{0, target.size()}});
  ASSERT_TRUE(Post(0, {.local_key = Region(*a_, source),
                       .remote_key = window,
                       .remote_offset = 0,
                       .bytes = 16,
                       .wr_id = 1})
                  .ok());
  std::optional<Completion> done = CompletionOf(1);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->status.ok()) << done->status;
  EXPECT_EQ(std::memcmp(target.data(), source.data(), 16), 0);
}

}  // namespace
}  // namespace fuselink::fabric
