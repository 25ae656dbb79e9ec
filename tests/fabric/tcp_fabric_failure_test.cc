// The TCP fabric against hostile and failing peers.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agent/common/status_macros.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/tcp/fabric.h"
#include "agent/fabric/tcp/handshake.h"
#include "agent/fabric/wire.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"

namespace fuselink::fabric {
namespace {

using testing::AuthenticatedRaw;
using testing::KeyRing;
using testing::LoopbackOptions;
using testing::RawConnect;
using testing::RecordingHandler;
using testing::SendRaw;
using testing::SilentPeer;
using testing::WaitUntilClosed;

constexpr uint8_t kUntouched = 0xAB;
constexpr uint32_t kMaxWriteBytes = 1 << 20;
constexpr size_t kRegionBytes = 4096;

// What a hostile client sends after connecting to NIC 0 of the target.
struct HostileCase {
  std::string name;
  // Authenticate as "raw" first; else the frame is the first thing the target reads
  // (and the connection fails its handshake).
  bool say_hello = true;
  // Builds the frame from the target region's key.
  std::string (*frame)(RegionKey key);
};

std::string AsString(const wire::HeaderBytes& header) {
  return std::string(reinterpret_cast<const char*>(header.data()), header.size());
}

std::string WriteFrame(RegionKey key, uint64_t offset, uint32_t bytes) {
  return AsString(wire::EncodeWrite({.key = key, .offset = offset, .bytes = bytes})) +
         std::string(std::min<uint32_t>(bytes, kRegionBytes), 'X');
}

const HostileCase kHostileCases[] = {
    {.name = "BadMagic",
     .frame =
         [](RegionKey key) {
           std::string frame = WriteFrame(key, 0, 16);
           frame[0] = 'Z';
           return frame;
         }},
    {.name = "UnknownType",
     .frame =
         [](RegionKey key) {
           std::string frame = WriteFrame(key, 0, 16);
           frame[6] = 9;
           return frame;
         }},
    {.name = "Oversize",
     .frame = [](RegionKey key) { return WriteFrame(key, 0, kMaxWriteBytes + 1); }},
    {.name = "WriteBeforeHello",
     .say_hello = false,
     .frame = [](RegionKey key) { return WriteFrame(key, 0, 16); }},
    {.name = "AckToTarget",
     .frame = [](RegionKey) { return AsString(wire::EncodeAck({.wr_id = 1})); }},
    {.name = "HelloOnWrongNic",
     .say_hello = false,
     .frame = [](RegionKey) { return *wire::EncodeHello(1, "raw", {}); }},
    {.name = "HelloAfterProof",
     .frame = [](RegionKey) { return *wire::EncodeHello(0, "raw", {}); }},
};

class HostileFrameTest : public ::testing::TestWithParam<HostileCase> {};

TEST_P(HostileFrameTest, ClosesCountsAndLeavesTheRegionAlone) {
  const HostileCase& hostile = GetParam();
  KeyRing keys;
  std::vector<uint8_t> region(kRegionBytes, kUntouched);  // outlives the fabric
  RecordingHandler target_events;
  TcpFabricOptions options = LoopbackOptions("target", 3, keys);
  options.max_write_bytes = kMaxWriteBytes;
  std::unique_ptr<Fabric> target = *CreateTcpFabric(options, &target_events);
  RegionKey key = *target->RegisterRegion(region.data(), region.size(), nullptr);

  absl::StatusOr<UniqueFd> raw = hostile.say_hello
                                     ? AuthenticatedRaw(keys, *target)
                                     : RawConnect(9, target->endpoints()[0]);
  ASSERT_TRUE(raw.ok()) << raw.status();
  const std::string bytes = hostile.frame(key);
  // The target may close before reading it all; a failed send is fine here.
  (void)SendRaw(raw->get(), bytes.data(), bytes.size());
  EXPECT_TRUE(WaitUntilClosed(raw->get()));

  // The fabric keeps serving: a well-behaved source still writes.
  RecordingHandler source_events;
  TcpFabricOptions source_options = LoopbackOptions("source", 1, keys);
  source_options.max_write_bytes = kMaxWriteBytes;
  std::unique_ptr<Fabric> source = *CreateTcpFabric(source_options, &source_events);
  PeerId peer = *source->Connect("target", target->endpoints());
  ASSERT_TRUE(source->PostWrite(peer, 0, {.imm = 1, .wr_id = 1}).ok());
  ASSERT_TRUE(source_events.WaitForCompletions(1));
  EXPECT_TRUE(source_events.completions()[0].status.ok());

  EXPECT_EQ(target->counters(0).malformed_frames, 1u);
  // Only a connection that never proved itself is an authentication failure.
  EXPECT_EQ(target->counters(0).auth_failures, hostile.say_hello ? 0u : 1u);
  EXPECT_EQ(target->counters(0).received_bytes, 0u);
  EXPECT_TRUE(std::all_of(region.begin(), region.end(),
                          [](uint8_t byte) { return byte == kUntouched; }));
  ASSERT_EQ(target_events.arrivals().size(), 1u);  // only the good notification
  EXPECT_EQ(target_events.arrivals()[0].imm, 1u);
}

INSTANTIATE_TEST_SUITE_P(Cases, HostileFrameTest, ::testing::ValuesIn(kHostileCases),
                         [](const ::testing::TestParamInfo<HostileCase>& info) {
                           return info.param.name;
                         });

// A write that a window does not admit: what the raw client "raw" sends, given the
// target region's key and the key of the window opened for it over
// [0, kRegionBytes / 2).
struct RefusedCase {
  std::string name;
  Refusal refusal;
  absl::StatusCode code;
  std::string reason;
  std::string (*frame)(Fabric& target, RegionKey region, WindowKey window);
};

const RefusedCase kRefusedCases[] = {
    {"RegionKeyIsNoWindow", Refusal::kNoWindow, absl::StatusCode::kNotFound,
     "WINDOW_CLOSED",
     [](Fabric&, RegionKey region, WindowKey) { return WriteFrame(region, 0, 16); }},
    {"UnknownWindow", Refusal::kNoWindow, absl::StatusCode::kNotFound, "WINDOW_CLOSED",
     [](Fabric&, RegionKey, WindowKey window) {
       return WriteFrame(window ^ 0x5a5a5a5a, 0, 16);
     }},
    {"PastTheWindow", Refusal::kOutsideWindow, absl::StatusCode::kOutOfRange,
     "OUTSIDE_WINDOW",
     [](Fabric&, RegionKey, WindowKey window) {
       return WriteFrame(window, kRegionBytes / 2 - 8, 16);
     }},
    {"PastTheRegion", Refusal::kOutsideWindow, absl::StatusCode::kOutOfRange,
     "OUTSIDE_WINDOW",
     [](Fabric&, RegionKey, WindowKey window) {
       return WriteFrame(window, kRegionBytes - 15, 16);
     }},
    {"OffsetWraps", Refusal::kOutsideWindow, absl::StatusCode::kOutOfRange,
     "OUTSIDE_WINDOW",
     [](Fabric&, RegionKey, WindowKey window) {
       return WriteFrame(window, std::numeric_limits<uint64_t>::max() - 7, 16);
     }},
    {"AnotherPeersWindow", Refusal::kNotYourWindow, absl::StatusCode::kPermissionDenied,
     "WINDOW_NOT_YOURS",
     [](Fabric& target, RegionKey region, WindowKey) {
       const Extent all{0, kRegionBytes};
       return WriteFrame(*target.OpenWindow(region, "other", {&all, 1}), 0, 16);
     }},
    {"LateWriteAfterClose", Refusal::kNoWindow, absl::StatusCode::kNotFound,
     "WINDOW_CLOSED",
     [](Fabric& target, RegionKey region, WindowKey) {
       const Extent all{0, kRegionBytes};
       const WindowKey closed = *target.OpenWindow(region, "raw", {&all, 1});
       target.CloseWindow(closed, [] {});
       return WriteFrame(closed, 0, 16);
     }},
};

class RefusedWriteTest : public ::testing::TestWithParam<RefusedCase> {};

// Nothing lands, the ACK says why, and the same connection goes on to place a write
// that its window does admit.
TEST_P(RefusedWriteTest, PlacesNothingAnswersWhyAndTheConnectionGoesOn) {
  const RefusedCase& refused = GetParam();
  KeyRing keys;
  std::vector<uint8_t> region(kRegionBytes, kUntouched);  // outlives the fabric
  RecordingHandler target_events;
  TcpFabricOptions options = LoopbackOptions("target", 3, keys);
  options.max_write_bytes = kMaxWriteBytes;
  std::unique_ptr<Fabric> target = *CreateTcpFabric(options, &target_events);
  const RegionKey key = *target->RegisterRegion(region.data(), region.size(), nullptr);
  const Extent half{0, kRegionBytes / 2};
  const WindowKey window = *target->OpenWindow(key, "raw", {&half, 1});

  // The writer authenticates: a refusal is about windows, not about who it is.
  absl::StatusOr<UniqueFd> raw = AuthenticatedRaw(keys, *target);
  ASSERT_TRUE(raw.ok()) << raw.status();
  std::string bytes = refused.frame(*target, key, window);
  std::string good =
      AsString(wire::EncodeWrite({.key = window, .offset = 8, .bytes = 4, .wr_id = 2}));
  good += "GOOD";
  bytes += good;
  ASSERT_TRUE(SendRaw(raw->get(), bytes.data(), bytes.size()).ok());

  for (int i = 0; i < 2; ++i) {
    wire::HeaderBytes header;
    ASSERT_TRUE(RecvAll(raw->get(), header.data(), header.size()).ok());
    absl::StatusOr<wire::Header> decoded = wire::DecodeHeader(header, kMaxWriteBytes);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    const auto* ack = std::get_if<wire::AckFrame>(&*decoded);
    ASSERT_NE(ack, nullptr);
    if (i == 0) {
      EXPECT_EQ(ack->refusal, refused.refusal);
      EXPECT_EQ(ack->code, refused.code);
      const absl::Status status = RefusalStatus(ack->refusal);
      EXPECT_EQ(status.code(), refused.code);
      EXPECT_EQ(ReasonOf(status), refused.reason);
    } else {
      EXPECT_EQ(ack->wr_id, 2u);
      EXPECT_EQ(ack->refusal, Refusal::kNone);
      EXPECT_EQ(ack->code, absl::StatusCode::kOk);
    }
  }
  std::vector<uint8_t> expected(kRegionBytes, kUntouched);
  std::memcpy(&expected[8], "GOOD", 4);
  EXPECT_TRUE(region == expected) << "bytes outside the admitted write changed";
  EXPECT_EQ(target->counters(0).refused_writes, 1u);
  EXPECT_EQ(target->counters(0).malformed_frames, 0u);
  EXPECT_EQ(target->counters(0).auth_failures, 0u);
  ASSERT_EQ(target_events.arrivals().size(), 1u);  // only the admitted write
  EXPECT_EQ(target_events.arrivals()[0].window, window);
  EXPECT_EQ(target_events.arrivals()[0].peer_name, "raw");
}

INSTANTIATE_TEST_SUITE_P(Cases, RefusedWriteTest, ::testing::ValuesIn(kRefusedCases),
                         [](const ::testing::TestParamInfo<RefusedCase>& info) {
                           return info.param.name;
                         });

TEST(TcpFabricFailureTest, HangingPeerFillsTheQueueThenItsWritesFail) {
  constexpr int kDepth = 8;
  constexpr uint32_t kWriteBytes = 1 << 20;
  KeyRing keys;
  absl::StatusOr<std::unique_ptr<SilentPeer>> silent =
      SilentPeer::Create(5, 2, "silent", keys.For("silent"));
  ASSERT_TRUE(silent.ok()) << silent.status();
  RecordingHandler events;
  TcpFabricOptions options = LoopbackOptions("a", 1, keys);
  options.queue_depth_per_nic = kDepth;
  std::unique_ptr<Fabric> fabric = *CreateTcpFabric(options, &events);
  absl::StatusOr<PeerId> peer = fabric->Connect("silent", (*silent)->endpoints());
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::vector<uint8_t> source(kWriteBytes);
  RegionKey key = *fabric->RegisterRegion(source.data(), source.size(), nullptr);

  const WriteOp op{.local_key = key, .remote_key = 1, .bytes = kWriteBytes};
  for (uint64_t i = 0; i < kDepth; ++i) {
    WriteOp numbered = op;
    numbered.wr_id = i;
    ASSERT_TRUE(fabric->PostWrite(*peer, 0, numbered).ok()) << i;
  }
  EXPECT_EQ(fabric->PostWrite(*peer, 0, op).code(), absl::StatusCode::kResourceExhausted);
  WriteOp on_nic1 = op;
  on_nic1.wr_id = kDepth;
  ASSERT_TRUE(fabric->PostWrite(*peer, 1, on_nic1).ok());  // NICs have their own queue

  // The peer crashes: every connection is reset.
  ASSERT_TRUE((*silent)->ResetAll(2 * options.connections_per_nic).ok());
  ASSERT_TRUE(events.WaitForPeersLost(1));
  const std::vector<Completion> completions = events.completions();
  ASSERT_EQ(completions.size(), kDepth + 1u);  // all of them, before OnPeerLost
  std::set<uint64_t> wr_ids;
  for (const Completion& completion : completions) {
    EXPECT_EQ(completion.status.code(), absl::StatusCode::kUnavailable);
    wr_ids.insert(completion.wr_id);
  }
  EXPECT_EQ(wr_ids.size(), kDepth + 1u);  // each exactly once
  EXPECT_EQ(events.peers_lost()[0].first, *peer);
  EXPECT_EQ(events.peers_lost()[0].second.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fabric->counters(0).transmitted_bytes, 0u);
  EXPECT_EQ(fabric->PostWrite(*peer, 0, op).code(), absl::StatusCode::kUnavailable);
}

TEST(TcpFabricFailureTest, DestructionFailsWritesInFlight) {
  KeyRing keys;
  absl::StatusOr<std::unique_ptr<SilentPeer>> silent =
      SilentPeer::Create(5, 2, "silent", keys.For("silent"));
  ASSERT_TRUE(silent.ok()) << silent.status();
  RecordingHandler events;
  std::unique_ptr<Fabric> fabric =
      *CreateTcpFabric(LoopbackOptions("a", 1, keys), &events);
  PeerId peer = *fabric->Connect("silent", (*silent)->endpoints());
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(fabric->PostWrite(peer, i % 2, {.wr_id = i}).ok());
  }
  fabric.reset();
  ASSERT_EQ(events.completions().size(), 4u);
  for (const Completion& completion : events.completions()) {
    EXPECT_EQ(completion.status.code(), absl::StatusCode::kUnavailable);
  }
  ASSERT_EQ(events.peers_lost().size(), 1u);
  EXPECT_EQ(events.peers_lost()[0].second.code(), absl::StatusCode::kCancelled);
}

TEST(TcpFabricFailureTest, PeerDestroyedMidStream) {
  constexpr size_t kWrites = 256;
  constexpr uint32_t kWriteBytes = 256 << 10;
  KeyRing keys;
  RecordingHandler a_events;
  RecordingHandler b_events;
  // Both buffers outlive the fabrics that read and write them.
  std::vector<uint8_t> source(kWriteBytes);
  // Every write has bytes of its own: the fabric spreads writes over its NICs and
  // connections, and two of them into the same bytes would race in the target's
  // memory (as two RDMA writes would).
  std::vector<uint8_t> target(kWrites * kWriteBytes);
  std::unique_ptr<Fabric> a = *CreateTcpFabric(LoopbackOptions("a", 1, keys), &a_events);
  std::unique_ptr<Fabric> b = *CreateTcpFabric(LoopbackOptions("b", 3, keys), &b_events);
  RegionKey source_key = *a->RegisterRegion(source.data(), source.size(), nullptr);
  RegionKey target_key = *b->RegisterRegion(target.data(), target.size(), nullptr);
  const Extent all{0, target.size()};
  const WindowKey target_window = *b->OpenWindow(target_key, "a", {&all, 1});
  PeerId peer = *a->Connect("b", b->endpoints());
  for (uint64_t i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(a->PostWrite(peer, static_cast<int>(i % 2),
                             {.local_key = source_key,
                              .remote_key = target_window,
                              .remote_offset = i * kWriteBytes,
                              .bytes = kWriteBytes,
                              .wr_id = i})
                    .ok());
  }
  // Once b has placed a write it knows "a" as a peer, and must report it lost.
  ASSERT_TRUE(b_events.WaitForArrivals(1));
  b.reset();
  ASSERT_TRUE(a_events.WaitForPeersLost(1));
  const std::vector<Completion> completions = a_events.completions();
  ASSERT_EQ(completions.size(), kWrites);
  std::set<uint64_t> wr_ids;
  for (const Completion& completion : completions) {
    EXPECT_TRUE(completion.status.ok() ||
                completion.status.code() == absl::StatusCode::kUnavailable)
        << completion.status;
    wr_ids.insert(completion.wr_id);
  }
  EXPECT_EQ(wr_ids.size(), kWrites);
  EXPECT_EQ(a_events.peers_lost().size(), 1u);
  EXPECT_EQ(a_events.peers_lost()[0].second.code(), absl::StatusCode::kUnavailable);
  ASSERT_EQ(b_events.peers_lost().size(), 1u);
  EXPECT_EQ(b_events.peers_lost()[0].second.code(), absl::StatusCode::kCancelled);
}

TEST(TcpFabricFailureTest, SilentClientDoesNotHoldUpDestruction) {
  KeyRing keys;
  RecordingHandler events;
  std::unique_ptr<Fabric> fabric =
      *CreateTcpFabric(LoopbackOptions("a", 1, keys), &events);
  absl::StatusOr<UniqueFd> raw = RawConnect(9, fabric->endpoints()[1]);
  ASSERT_TRUE(raw.ok()) << raw.status();
  fabric.reset();  // must not wait for a HELLO that never comes
  EXPECT_TRUE(WaitUntilClosed(raw->get()));
  EXPECT_TRUE(events.peers_lost().empty());  // it never became a peer
}

// Fabric "a" holding a key for "hole", and a listener at 127.0.0.7 that never
// accepts, with a kernel backlog of `backlog`.
class CancelConnectsTest : public ::testing::Test {
 protected:
  void Listen(int backlog) {
    keys_.For("hole");
    fabric_ = *CreateTcpFabric(LoopbackOptions("a", 1, keys_), &events_);
    absl::StatusOr<UniqueFd> listener =
        testing::DeafListener(testing::LoopbackAddress(7), backlog, &hole_);
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
  }

  KeyRing keys_;
  RecordingHandler events_;
  std::unique_ptr<Fabric> fabric_;
  UniqueFd listener_;
  Endpoint hole_;
};

// The peer's kernel completes the TCP handshake, and nobody reads the HELLO: the
// fabric waits in its own handshake.
TEST_F(CancelConnectsTest, EndsAHandshakeNobodyAnswers) {
  ASSERT_NO_FATAL_FAILURE(Listen(64));
  testing::ExpectCancelEndsTheConnect(*fabric_, hole_);
}

// The peer's accept queue is full, so its kernel drops the SYN: the connect itself
// waits, as it does for a host that is down behind a black hole.
TEST_F(CancelConnectsTest, EndsAConnectWhoseSynIsUnanswered) {
  ASSERT_NO_FATAL_FAILURE(Listen(0));
  const Endpoint& hole = hole_;
  absl::StatusOr<UniqueFd> filler = RawConnect(8, hole);  // fills the queue
  ASSERT_TRUE(filler.ok()) << filler.status();
  // The precondition: a further connect is left waiting for the SYN's answer.
  SocketAddress from = *ParseSocketAddress(testing::LoopbackAddress(8), 0);
  SocketAddress to = *ParseSocketAddress(hole.address, hole.port);
  absl::StatusOr<UniqueFd> probe = BoundDataSocket(from, to);
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(ConnectSocket(probe->get(), to, 300).code(),
            absl::StatusCode::kUnavailable)  // ETIMEDOUT
      << "the SYN was answered; this kernel does not drop it on a full queue";
  testing::ExpectCancelEndsTheConnect(*fabric_, hole);
}

TEST(TcpFabricFailureTest, RejectsBadOptions) {
  KeyRing keys;
  RecordingHandler events;
  TcpFabricOptions options = LoopbackOptions("a", 1, keys);
  EXPECT_EQ(CreateTcpFabric(options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  TcpFabricOptions no_keys = options;
  no_keys.keys = nullptr;
  EXPECT_EQ(CreateTcpFabric(no_keys, &events).status().code(),
            absl::StatusCode::kInvalidArgument);
  TcpFabricOptions no_name = options;
  no_name.node_name = "";
  EXPECT_EQ(CreateTcpFabric(no_name, &events).status().code(),
            absl::StatusCode::kInvalidArgument);
  TcpFabricOptions bad_address = options;
  bad_address.nics[1].address = "not-an-address";
  EXPECT_EQ(CreateTcpFabric(bad_address, &events).status().code(),
            absl::StatusCode::kInvalidArgument);
  TcpFabricOptions misnumbered = options;
  misnumbered.nics[1].nic = 0;
  EXPECT_EQ(CreateTcpFabric(misnumbered, &events).status().code(),
            absl::StatusCode::kInvalidArgument);
  TcpFabricOptions zero_depth = options;
  zero_depth.queue_depth_per_nic = 0;
  EXPECT_EQ(CreateTcpFabric(zero_depth, &events).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fuselink::fabric
