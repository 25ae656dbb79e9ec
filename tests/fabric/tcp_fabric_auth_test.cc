// The TCP fabric's connection handshake against impostors: a connection must prove
// the key agreed for the name it gives before any write of its is read.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "agent/common/status_macros.h"
#include "agent/fabric/handshake.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/tcp/connection.h"
#include "agent/fabric/tcp/fabric.h"
#include "agent/fabric/tcp/handshake.h"
#include "agent/fabric/wire.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"

namespace fuselink::fabric {
namespace {

using testing::KeyRing;
using testing::LoopbackOptions;
using testing::RawConnect;
using testing::RecordingHandler;
using testing::SendRaw;
using testing::WaitUntilClosed;

constexpr uint8_t kUntouched = 0xAB;
constexpr size_t kRegionBytes = 4096;
constexpr int kRawTimeoutMs = 5000;

std::string WriteInto(WindowKey window) {
  const wire::HeaderBytes header =
      wire::EncodeWrite({.key = window, .offset = 0, .bytes = 16, .wr_id = 1});
  return std::string(reinterpret_cast<const char*>(header.data()), header.size()) +
         std::string(16, 'X');
}

// An impostor's half of the handshake: HELLO as `name` with `client_nonce`; returns
// the CHALLENGE's server nonce, or the error when the target closes first.
absl::StatusOr<handshake::Nonce> SayHello(int fd, absl::string_view name,
                                          const handshake::Nonce& client_nonce) {
  FL_ASSIGN_OR_RETURN(std::string hello, wire::EncodeHello(0, name, client_nonce));
  FL_RETURN_IF_ERROR(SendRaw(fd, hello.data(), hello.size()));
  FL_RETURN_IF_ERROR(SetReceiveTimeout(fd, kRawTimeoutMs));
  wire::HeaderBytes header;
  FL_RETURN_IF_ERROR(RecvAll(fd, header.data(), header.size()));
  FL_ASSIGN_OR_RETURN(wire::Header decoded, wire::DecodeHeader(header, 0));
  const auto* challenge = std::get_if<wire::ChallengeHeader>(&decoded);
  if (challenge == nullptr) return absl::InvalidArgumentError("expected a CHALLENGE");
  handshake::Mac mac_a;
  FL_RETURN_IF_ERROR(RecvAll(fd, mac_a.data(), mac_a.size()));
  return challenge->server_nonce;
}

// Target "b" with a window for "a" over its whole region; the real peer "a" holds
// agreed keys. Each test plays an impostor, then checks that nothing landed and that
// "a" is still served.
class TcpFabricAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    b_ = *CreateTcpFabric(LoopbackOptions("b", 3, keys_), &b_events_);
    region_key_ = *b_->RegisterRegion(region_.data(), region_.size(), nullptr);
    const Extent all{0, kRegionBytes};
    window_ = *b_->OpenWindow(region_key_, "a", {&all, 1});
    a_keys_ = keys_.For("a");
  }

  // What every impostor leaves behind: the region untouched, no arrival, one failure
  // counted; then "a" itself connects and places bytes.
  // The acceptor counts a failure once its handshake gives up, which may be after the
  // connector has seen the close.
  bool WaitForAuthFailures(uint64_t count) {
    const absl::Time deadline = absl::Now() + testing::kWaitTimeout;
    while (b_->counters(0).auth_failures < count) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  void ExpectNothingLandedAndTheRealPeerIsServed(uint64_t auth_failures = 1) {
    EXPECT_TRUE(WaitForAuthFailures(auth_failures));
    EXPECT_TRUE(std::all_of(region_.begin(), region_.end(),
                            [](uint8_t byte) { return byte == kUntouched; }));
    EXPECT_EQ(b_->counters(0).received_bytes, 0u);
    EXPECT_EQ(b_->counters(0).auth_failures, auth_failures);
    EXPECT_TRUE(b_events_.arrivals().empty());
    EXPECT_FALSE(b_->FindPeer("a").has_value()) << "the impostor became a peer";
    ExpectTheRealPeerIsServed();
    EXPECT_EQ(b_->counters(0).auth_failures, auth_failures);
  }

  // "a" itself connects and places 16 bytes at offset 64 of the window.
  void ExpectTheRealPeerIsServed() {
    // Declared before the fabric: its memory outlives every send that reads it.
    std::vector<uint8_t> source(16, 'R');
    RecordingHandler a_events;
    std::unique_ptr<Fabric> a =
        *CreateTcpFabric(LoopbackOptions("a", 1, keys_), &a_events);
    const RegionKey source_key =
        *a->RegisterRegion(source.data(), source.size(), nullptr);
    absl::StatusOr<PeerId> peer = a->Connect("b", b_->endpoints());
    ASSERT_TRUE(peer.ok()) << peer.status();
    ASSERT_TRUE(a->PostWrite(*peer, 0,
                             {.local_key = source_key,
                              .remote_key = window_,
                              .remote_offset = 64,
                              .bytes = 16,
                              .wr_id = 7})
                    .ok());
    ASSERT_TRUE(a_events.WaitForCompletions(1));
    EXPECT_TRUE(a_events.completions()[0].status.ok())
        << a_events.completions()[0].status;
    EXPECT_EQ(std::memcmp(&region_[64], source.data(), 16), 0);
  }

  KeyRing keys_;  // outlives the fabrics
  RecordingHandler b_events_;
  std::vector<uint8_t> region_ = std::vector<uint8_t>(kRegionBytes, kUntouched);
  std::unique_ptr<Fabric> b_;
  RegionKey region_key_ = 0;
  WindowKey window_ = 0;
  FabricKeys* a_keys_ = nullptr;
};

TEST_F(TcpFabricAuthTest, UnknownNameGetsNoChallenge) {
  absl::StatusOr<UniqueFd> raw = RawConnect(9, b_->endpoints()[0]);
  ASSERT_TRUE(raw.ok()) << raw.status();
  absl::StatusOr<handshake::Nonce> challenge = SayHello(raw->get(), "mallory", {});
  EXPECT_FALSE(challenge.ok());
  EXPECT_TRUE(WaitUntilClosed(raw->get()));
  ExpectNothingLandedAndTheRealPeerIsServed();
}

TEST_F(TcpFabricAuthTest, ForgedHelloUnderARealNameWithAWrongKeyIsClosed) {
  absl::StatusOr<UniqueFd> raw = RawConnect(9, b_->endpoints()[0]);
  ASSERT_TRUE(raw.ok()) << raw.status();
  const handshake::Nonce client_nonce = *handshake::NewNonce();
  absl::StatusOr<handshake::Nonce> server_nonce = SayHello(raw->get(), "a", client_nonce);
  ASSERT_TRUE(server_nonce.ok()) << server_nonce.status();
  const handshake::Mac forged =
      *handshake::ComputeMac(*RandomKey(), handshake::Side::kConnector,
                             {.connector = "a",
                              .acceptor = "b",
                              .nic = 0,
                              .client_nonce = client_nonce,
                              .server_nonce = *server_nonce});
  const std::string bytes = wire::EncodeProof(forged) + WriteInto(window_);
  (void)SendRaw(raw->get(), bytes.data(), bytes.size());  // may be closed mid-way
  EXPECT_TRUE(WaitUntilClosed(raw->get()));
  ExpectNothingLandedAndTheRealPeerIsServed();
}

TEST_F(TcpFabricAuthTest, WriteInsteadOfProofIsClosed) {
  absl::StatusOr<UniqueFd> raw = RawConnect(9, b_->endpoints()[0]);
  ASSERT_TRUE(raw.ok()) << raw.status();
  ASSERT_TRUE(SayHello(raw->get(), "a", {}).ok());
  const std::string bytes = WriteInto(window_);
  (void)SendRaw(raw->get(), bytes.data(), bytes.size());
  EXPECT_TRUE(WaitUntilClosed(raw->get()));
  EXPECT_EQ(b_->counters(0).malformed_frames, 1u);
  ExpectNothingLandedAndTheRealPeerIsServed();
}

// An eavesdropper recorded a real connection's HELLO and PROOF; replayed on a new
// connection they meet a fresh server nonce and fail.
TEST_F(TcpFabricAuthTest, ReplayedProofIsClosed) {
  const SessionKey key = *a_keys_->FindConnectKey("b");
  const handshake::Nonce client_nonce = *handshake::NewNonce();
  handshake::Mac recorded;
  {
    absl::StatusOr<UniqueFd> real = RawConnect(1, b_->endpoints()[0]);
    ASSERT_TRUE(real.ok()) << real.status();
    absl::StatusOr<handshake::Nonce> server_nonce =
        SayHello(real->get(), "a", client_nonce);
    ASSERT_TRUE(server_nonce.ok()) << server_nonce.status();
    recorded = *handshake::ComputeMac(key, handshake::Side::kConnector,
                                      {.connector = "a",
                                       .acceptor = "b",
                                       .nic = 0,
                                       .client_nonce = client_nonce,
                                       .server_nonce = *server_nonce});
    const std::string proof = wire::EncodeProof(recorded);
    ASSERT_TRUE(SendRaw(real->get(), proof.data(), proof.size()).ok());
  }  // the real connection goes; "a" was briefly a peer of b's
  ASSERT_TRUE(b_events_.WaitForPeersLost(1));

  absl::StatusOr<UniqueFd> raw = RawConnect(9, b_->endpoints()[0]);
  ASSERT_TRUE(raw.ok()) << raw.status();
  ASSERT_TRUE(SayHello(raw->get(), "a", client_nonce).ok());
  const std::string bytes = wire::EncodeProof(recorded) + WriteInto(window_);
  (void)SendRaw(raw->get(), bytes.data(), bytes.size());
  EXPECT_TRUE(WaitUntilClosed(raw->get()));
  ExpectNothingLandedAndTheRealPeerIsServed();
}

// Says HELLO and then nothing: closed once kHelloTimeoutMs has passed.
TEST_F(TcpFabricAuthTest, SilenceAfterHelloIsClosedInTime) {
  absl::StatusOr<UniqueFd> raw = RawConnect(9, b_->endpoints()[0]);
  ASSERT_TRUE(raw.ok()) << raw.status();
  ASSERT_TRUE(SayHello(raw->get(), "a", {}).ok());
  ASSERT_LT(absl::Milliseconds(kHelloTimeoutMs), testing::kWaitTimeout)
      << "WaitUntilClosed must outlast the handshake timeout";
  EXPECT_TRUE(WaitUntilClosed(raw->get()));
  ExpectNothingLandedAndTheRealPeerIsServed();
}

// A stranger holding many silent connections (more than may wait in their handshake)
// does not keep a real peer out: the oldest unproven ones are closed for newer ones,
// each counted, and the real peer's connections prove themselves at once.
TEST_F(TcpFabricAuthTest, ManySilentConnectionsDoNotKeepARealPeerOut) {
  constexpr size_t kExtra = 8;
  std::vector<UniqueFd> silent;
  for (size_t i = 0; i < handshake::kMaxUnprovenConnections + kExtra; ++i) {
    absl::StatusOr<UniqueFd> raw = RawConnect(9, b_->endpoints()[0]);
    ASSERT_TRUE(raw.ok()) << raw.status();
    silent.push_back(*std::move(raw));
  }
  // The first kExtra were closed to make room, oldest first, each counted.
  for (size_t i = 0; i < kExtra; ++i) EXPECT_TRUE(WaitUntilClosed(silent[i].get())) << i;
  EXPECT_TRUE(WaitForAuthFailures(kExtra));
  ExpectTheRealPeerIsServed();
  EXPECT_EQ(b_->counters(0).received_bytes, 16u);
}

TEST_F(TcpFabricAuthTest, ConnectToAnImpostorAcceptorFails) {
  // "a" holds a connect key for "b" that b never made: whoever answers on b's
  // endpoints cannot prove it.
  a_keys_->SetConnectKey("b", *RandomKey());
  RecordingHandler a_events;
  std::unique_ptr<Fabric> a = *CreateTcpFabric(LoopbackOptions("a", 1, keys_), &a_events);
  absl::StatusOr<PeerId> peer = a->Connect("b", b_->endpoints());
  ASSERT_EQ(peer.status().code(), absl::StatusCode::kUnavailable) << peer.status();
  EXPECT_EQ(ReasonOf(peer.status()), handshake::kAuthReason) << peer.status();
  EXPECT_NE(peer.status().message().find("NIC 0"), std::string::npos) << peer.status();
  // b saw a connection that never sent its PROOF.
  EXPECT_TRUE(WaitForAuthFailures(1));
  EXPECT_EQ(b_->counters(0).auth_failures, 1u);
  EXPECT_TRUE(b_events_.peers_lost().empty());  // it never became a peer
}

TEST_F(TcpFabricAuthTest, ConnectWithoutAKeyFailsFirst) {
  KeyRing lone;  // c knows nobody
  RecordingHandler c_events;
  std::unique_ptr<Fabric> c = *CreateTcpFabric(LoopbackOptions("c", 7, lone), &c_events);
  absl::StatusOr<PeerId> peer = c->Connect("b", b_->endpoints());
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kFailedPrecondition) << peer.status();
  EXPECT_EQ(ReasonOf(peer.status()), "FABRIC_NO_KEY");
  EXPECT_EQ(b_->counters(0).auth_failures, 0u);  // nothing was even sent
}

TEST_F(TcpFabricAuthTest, ConnectToAnAcceptorThatDoesNotKnowUsFails) {
  // d holds a key for b, but b never made one for d (or has forgotten it since).
  KeyRing strangers;
  strangers.For("d")->SetConnectKey("b", *RandomKey());
  RecordingHandler d_events;
  std::unique_ptr<Fabric> d =
      *CreateTcpFabric(LoopbackOptions("d", 7, strangers), &d_events);
  absl::StatusOr<PeerId> peer = d->Connect("b", b_->endpoints());
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kUnavailable) << peer.status();
  ExpectNothingLandedAndTheRealPeerIsServed();
}

TEST_F(TcpFabricAuthTest, ForgottenPeerIsRefusedAgain) {
  keys_.For("b")->Forget("a");
  RecordingHandler a_events;
  std::unique_ptr<Fabric> a = *CreateTcpFabric(LoopbackOptions("a", 1, keys_), &a_events);
  EXPECT_EQ(a->Connect("b", b_->endpoints()).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(WaitForAuthFailures(1));
}

}  // namespace
}  // namespace fuselink::fabric
