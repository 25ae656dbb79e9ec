// The TCP fabric's bounds on waits (tcp/fabric.h): a peer that stops mid-frame, a
// target that never acknowledges, one that acknowledges late but in time, and a peer
// that opens connections past its share. Raw sockets play the misbehaving side.
// Times are printed as "bench:" lines; only the bounds themselves are asserted: never
// before the bound, and not past it by more than its check period and kSlackMs.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/base/dynamic_annotations.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/tcp/connection.h"
#include "agent/fabric/tcp/fabric.h"
#include "agent/fabric/tcp/handshake.h"
#include "agent/fabric/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"

namespace fuselink::fabric {
namespace {

using testing::AuthenticatedRaw;
using testing::KeyRing;
using testing::LoopbackAddress;
using testing::LoopbackOptions;
using testing::ManyBytes;
using testing::RawConnect;
using testing::RecordingHandler;
using testing::SendRaw;
using testing::WaitUntilClosed;

constexpr size_t kRegionBytes = 1 << 20;
constexpr uint8_t kUntouched = 0xAB;
// What a loaded 2-core machine under a sanitizer may add to a bound that fired: wide,
// so that only a bound that did not fire (or fired a whole bound late) fails.
constexpr double kSlackMs = 3000;

std::string AsString(const wire::HeaderBytes& header) {
  return std::string(reinterpret_cast<const char*>(header.data()), header.size());
}

// Waits up to kWaitTimeout for `condition`.
template <typename Condition>
bool WaitUntil(Condition condition) {
  const absl::Time deadline = absl::Now() + testing::kWaitTimeout;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// True when the peer has closed `fd` already (EOF or reset readable now).
bool ClosedNow(int fd) {
  pollfd waiting{.fd = fd, .events = POLLIN, .revents = 0};
  if (poll(&waiting, 1, 0) <= 0) return false;
  char byte;
  const ssize_t got = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return got == 0 || (got < 0 && errno == ECONNRESET);
}

double MillisecondsSince(absl::Time start) {
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

// A fabric target of one NIC, "rawtarget", played by hand: it authenticates every
// connection and reads every WRITE in full, then acknowledges it `ack_delay` later,
// or never when `ack_delay` is absl::InfiniteDuration().
class RawTarget {
 public:
  RawTarget(int host, const FabricKeys* keys, absl::Duration ack_delay)
      : keys_(keys), ack_delay_(ack_delay) {
    const SocketAddress address = *ParseSocketAddress(LoopbackAddress(host), 0);
    listener_ = *Listen(address);
    endpoint_ = {.nic = 0,
                 .address = LoopbackAddress(host),
                 .port = LocalAddress(listener_.get())->port()};
    acceptor_ = std::thread(&RawTarget::Accept, this);
  }
  ~RawTarget() {
    // Wakes the accept and every read: shutdown(2) ends blocked calls at once.
    shutdown(listener_.get(), SHUT_RDWR);
    acceptor_.join();
    {
      absl::MutexLock lock(&mu_);
      for (const UniqueFd& fd : connections_) shutdown(fd.get(), SHUT_RDWR);
    }
    for (std::thread& thread : servers_) thread.join();
  }
  std::vector<Endpoint> endpoints() const { return {endpoint_}; }
  int writes_read() const { return writes_read_.load(); }

 private:
  void Accept() {
    while (true) {
      absl::StatusOr<UniqueFd> socket = fabric::Accept(listener_.get());
      if (!socket.ok()) return;  // shut down
      absl::MutexLock lock(&mu_);
      const int fd = socket->get();
      connections_.push_back(*std::move(socket));
      servers_.emplace_back(&RawTarget::Serve, this, fd);
    }
  }

  void Serve(int fd) {
    if (!AuthenticateConnector(fd, 0, "rawtarget", *keys_, /*max_write_bytes=*/1u << 30,
                               /*timeout_ms=*/5000)
             .ok()) {
      return;
    }
    std::vector<uint8_t> payload;
    while (true) {
      wire::HeaderBytes header;
      if (!RecvAll(fd, header.data(), header.size()).ok()) return;
      absl::StatusOr<wire::Header> decoded = wire::DecodeHeader(header, 1u << 30);
      if (!decoded.ok()) return;
      const auto* write = std::get_if<wire::WriteHeader>(&*decoded);
      if (write == nullptr) return;
      payload.resize(write->bytes);
      if (!RecvAll(fd, payload.data(), payload.size()).ok()) return;
      writes_read_.fetch_add(1);
      if (ack_delay_ == absl::InfiniteDuration()) continue;
      absl::SleepFor(ack_delay_);  // the behaviour played, not a synchronisation
      wire::HeaderBytes ack = wire::EncodeAck({.wr_id = write->wr_id});
      if (!SendRaw(fd, ack.data(), ack.size()).ok()) return;
    }
  }

  const FabricKeys* const keys_;
  const absl::Duration ack_delay_;
  UniqueFd listener_;
  Endpoint endpoint_;
  std::atomic<int> writes_read_{0};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<UniqueFd> connections_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> servers_;  // written by the acceptor, joined after it
};

// A source peer "raw" sends a WRITE's header and part of its payload into its window,
// then stops. Within the stall bound the target closes that connection, counts it,
// and the window's CloseWindow drains; a connection that merely idles stays open, and
// a healthy peer's writes land byte-exact all the while.
TEST(TcpFabricBoundsTest, PeerStalledMidPayloadIsClosedAndTheWindowDrains) {
  constexpr int kStallMs = 500;
  constexpr uint32_t kWriteBytes = 64 << 10;
  constexpr size_t kSentBytes = 1000;
  KeyRing keys;
  std::vector<uint8_t> region(kRegionBytes, kUntouched);  // outlives the fabrics
  std::vector<uint8_t> source_bytes = ManyBytes(kRegionBytes / 2, 7);
  RecordingHandler target_events;
  TcpFabricOptions options = LoopbackOptions("target", 3, keys);
  options.stall_timeout_ms = kStallMs;
  std::unique_ptr<Fabric> target = *CreateTcpFabric(options, &target_events);
  const RegionKey region_key =
      *target->RegisterRegion(region.data(), region.size(), nullptr);
  const Extent low{0, kRegionBytes / 2};
  const Extent high{kRegionBytes / 2, kRegionBytes / 2};
  const WindowKey raw_window = *target->OpenWindow(region_key, "raw", {&low, 1});
  const WindowKey source_window = *target->OpenWindow(region_key, "source", {&high, 1});

  absl::StatusOr<UniqueFd> idle = AuthenticatedRaw(keys, *target);
  ASSERT_TRUE(idle.ok()) << idle.status();
  absl::StatusOr<UniqueFd> raw = AuthenticatedRaw(keys, *target);
  ASSERT_TRUE(raw.ok()) << raw.status();
  const std::string partial =
      AsString(wire::EncodeWrite(
          {.key = raw_window, .offset = 0, .bytes = kWriteBytes, .wr_id = 1})) +
      std::string(kSentBytes, 'S');
  ASSERT_TRUE(SendRaw(raw->get(), partial.data(), partial.size()).ok());
  const absl::Time stalled_at = absl::Now();
  // The write was admitted and is placing: its first bytes are in the region. The
  // connection's thread is still inside its recv into that memory (it is waiting for
  // the rest), so nothing orders this read after its write: an intended race, the
  // test watching memory as it would watch a NIC place bytes, told to ThreadSanitizer.
  ASSERT_TRUE(WaitUntil(
      [&] { return ABSL_ANNOTATE_UNPROTECTED_READ(region[kSentBytes - 1]) == 'S'; }));

  absl::Notification drained;
  std::atomic<uint64_t> stalls_when_drained{0};
  target->CloseWindow(raw_window, [&] {
    stalls_when_drained.store(target->counters(0).stalled_connections);
    drained.Notify();
  });

  // A healthy peer is served meanwhile, byte-exact.
  RecordingHandler source_events;
  std::unique_ptr<Fabric> source =
      *CreateTcpFabric(LoopbackOptions("source", 1, keys), &source_events);
  const RegionKey source_key =
      *source->RegisterRegion(source_bytes.data(), source_bytes.size(), nullptr);
  absl::StatusOr<PeerId> peer = source->Connect("target", target->endpoints());
  ASSERT_TRUE(peer.ok()) << peer.status();
  ASSERT_TRUE(source
                  ->PostWrite(*peer, 0,
                              {.local_key = source_key,
                               .remote_key = source_window,
                               .remote_offset = kRegionBytes / 2,
                               .bytes = static_cast<uint32_t>(source_bytes.size()),
                               .wr_id = 2})
                  .ok());
  ASSERT_TRUE(source_events.WaitForCompletions(1));
  EXPECT_TRUE(source_events.completions()[0].status.ok())
      << source_events.completions()[0].status;
  EXPECT_TRUE(std::equal(source_bytes.begin(), source_bytes.end(),
                         region.begin() + kRegionBytes / 2));

  EXPECT_TRUE(WaitUntilClosed(raw->get()));
  const double stall_to_close_ms = MillisecondsSince(stalled_at);
  ASSERT_TRUE(drained.WaitForNotificationWithTimeout(testing::kWaitTimeout));
  std::printf("bench: stall to close %.0f ms (stall_timeout_ms %d)\n", stall_to_close_ms,
              kStallMs);
  EXPECT_GE(stall_to_close_ms, kStallMs) << "closed before the bound";
  // Checked every quarter of the bound.
  EXPECT_LE(stall_to_close_ms, kStallMs * 1.25 + kSlackMs) << "held past the bound";
  // The window drained because the stalled write was given up, not before.
  EXPECT_EQ(stalls_when_drained.load(), 1u);
  EXPECT_EQ(target->counters(0).stalled_connections, 1u);
  EXPECT_EQ(target->counters(1).stalled_connections, 0u);
  EXPECT_EQ(target->counters(0).malformed_frames, 0u);
  // Idle longer than the bound, between frames: legitimate, still open.
  EXPECT_FALSE(ClosedNow(idle->get()));
  // Nothing of the stalled write arrived, and nothing past its bytes was touched.
  for (const Arrival& arrival : target_events.arrivals()) {
    EXPECT_EQ(arrival.peer_name, "source");
  }
  EXPECT_EQ(region[kSentBytes], kUntouched);
}

// Counts arrivals and nothing else: a test that sends hundreds of thousands of
// notifications keeps no record of each.
class CountingHandler final : public Handler {
 public:
  void OnCompletion(const Completion&) override {}
  void OnArrival(const Arrival&) override { arrivals.fetch_add(1); }
  void OnPeerLost(PeerId, absl::string_view, const absl::Status&) override {}
  std::atomic<uint64_t> arrivals{0};
};

// A source that sends notifications and never reads their ACKs: once the target's
// ACKs fill both sockets' buffers, an ACK that finds no room for the stall bound
// closes the connection, counted as a stall.
TEST(TcpFabricBoundsTest, PeerThatReadsNoAcksIsClosedWithinTheBound) {
  constexpr int kStallMs = 300;
  // More ACKs than the target's send buffer (4 MiB asked, 8 MiB granted) and the
  // raw socket's small receive buffer hold: kNotifications * 40 bytes > 8 MiB.
  constexpr size_t kNotifications = 400'000;
  KeyRing keys;
  CountingHandler events;
  TcpFabricOptions options = LoopbackOptions("target", 3, keys, /*nic_count=*/1);
  options.stall_timeout_ms = kStallMs;
  std::unique_ptr<Fabric> target = *CreateTcpFabric(options, &events);

  const SocketAddress local = *ParseSocketAddress(LoopbackAddress(9), 0);
  const SocketAddress remote =
      *ParseSocketAddress(target->endpoints()[0].address, target->endpoints()[0].port);
  UniqueFd raw = *BoundDataSocket(local, remote);
  const int small_bytes = 4096;
  ASSERT_EQ(
      setsockopt(raw.get(), SOL_SOCKET, SO_RCVBUF, &small_bytes, sizeof(small_bytes)), 0);
  ASSERT_TRUE(ConnectSocket(raw.get(), remote, /*timeout_ms=*/5000).ok());
  ASSERT_TRUE(ProveToAcceptor(raw.get(), 0, "raw", "target",
                              *keys.For("raw")->FindConnectKey("target"),
                              /*timeout_ms=*/5000)
                  .ok());
  std::string frames;
  frames.reserve(kNotifications * wire::kHeaderBytes);
  for (size_t i = 0; i < kNotifications; ++i) {
    frames += AsString(wire::EncodeWrite({.imm = 1, .wr_id = i}));
  }
  const absl::Time started = absl::Now();
  // Ends when the target closes (or everything fit in the buffers); either is fine.
  (void)SendRaw(raw.get(), frames.data(), frames.size());
  ASSERT_TRUE(WaitUntil([&] { return target->counters(0).stalled_connections == 1; }));
  std::printf(
      "bench: %llu ACKs sent, then the connection closed %.0f ms after the "
      "first frame (stall_timeout_ms %d)\n",
      static_cast<unsigned long long>(events.arrivals.load()), MillisecondsSince(started),
      kStallMs);
  EXPECT_LT(events.arrivals.load(), kNotifications) << "every ACK found room";
  EXPECT_TRUE(WaitUntilClosed(raw.get()));
}

// The source's connection to a target that reads its writes and never acknowledges
// them closes after the ACK bound: the write completes UNAVAILABLE with the reason,
// counted once; the idle second connection on its NIC closes with it.
TEST(TcpFabricBoundsTest, TargetThatNeverAcksFailsTheWriteWithinTheBound) {
  constexpr int kAckTimeoutMs = 300;
  KeyRing keys;
  RawTarget target(5, keys.For("rawtarget"), absl::InfiniteDuration());
  std::vector<uint8_t> source_bytes = ManyBytes(64 << 10, 3);  // outlives the fabric
  RecordingHandler events;
  TcpFabricOptions options = LoopbackOptions("source", 1, keys, /*nic_count=*/1);
  options.ack_timeout_ms = kAckTimeoutMs;
  std::unique_ptr<Fabric> source = *CreateTcpFabric(options, &events);
  const RegionKey key =
      *source->RegisterRegion(source_bytes.data(), source_bytes.size(), nullptr);
  absl::StatusOr<PeerId> peer = source->Connect("rawtarget", target.endpoints());
  ASSERT_TRUE(peer.ok()) << peer.status();

  const absl::Time posted_at = absl::Now();
  ASSERT_TRUE(source
                  ->PostWrite(*peer, 0,
                              {.local_key = key,
                               .remote_key = 1,
                               .bytes = static_cast<uint32_t>(source_bytes.size()),
                               .wr_id = 1})
                  .ok());
  ASSERT_TRUE(events.WaitForCompletions(1));
  const double post_to_failure_ms = MillisecondsSince(posted_at);
  std::printf("bench: post to UNAVAILABLE %.0f ms (ack_timeout_ms %d)\n",
              post_to_failure_ms, kAckTimeoutMs);
  const Completion completion = events.completions()[0];
  EXPECT_EQ(completion.wr_id, 1u);
  EXPECT_EQ(completion.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(completion.status), kAckTimeoutReason) << completion.status;
  EXPECT_GE(post_to_failure_ms, kAckTimeoutMs) << "failed before the bound";
  EXPECT_LE(post_to_failure_ms, kAckTimeoutMs * 1.25 + kSlackMs)
      << "waited past the bound";
  EXPECT_EQ(target.writes_read(), 1);  // it did read the write
  EXPECT_EQ(source->counters(0).ack_timeouts, 1u);
  EXPECT_EQ(source->counters(0).transmitted_bytes, 0u);
  // Its sibling on the same NIC, idle, closed with it (the same path to the same
  // process), so that a write going again does not wait out the bound there too; with
  // its only NIC gone, the peer is lost, for the same reason. Counted once.
  ASSERT_TRUE(events.WaitForPeersLost(1));
  EXPECT_EQ(events.peers_lost()[0].first, *peer);
  EXPECT_THAT(std::string(events.peers_lost()[0].second.message()),
              ::testing::HasSubstr("no ACK for"));
  EXPECT_EQ(source->counters(0).ack_timeouts, 1u);
}

// ACKs that come late, but each within the bound of the one before, are fine.
TEST(TcpFabricBoundsTest, LateAcksWithinTheBoundComplete) {
  constexpr int kAckTimeoutMs = 2000;
  constexpr int kWrites = 4;
  KeyRing keys;
  RawTarget target(5, keys.For("rawtarget"), absl::Milliseconds(kAckTimeoutMs / 5));
  std::vector<uint8_t> source_bytes = ManyBytes(16 << 10, 5);  // outlives the fabric
  RecordingHandler events;
  TcpFabricOptions options = LoopbackOptions("source", 1, keys, /*nic_count=*/1);
  options.ack_timeout_ms = kAckTimeoutMs;
  std::unique_ptr<Fabric> source = *CreateTcpFabric(options, &events);
  const RegionKey key =
      *source->RegisterRegion(source_bytes.data(), source_bytes.size(), nullptr);
  absl::StatusOr<PeerId> peer = source->Connect("rawtarget", target.endpoints());
  ASSERT_TRUE(peer.ok()) << peer.status();

  const absl::Time posted_at = absl::Now();
  for (uint64_t i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(source
                    ->PostWrite(*peer, 0,
                                {.local_key = key,
                                 .remote_key = 1,
                                 .bytes = static_cast<uint32_t>(source_bytes.size()),
                                 .wr_id = i})
                    .ok());
  }
  ASSERT_TRUE(events.WaitForCompletions(kWrites));
  std::printf("bench: %d writes acknowledged %d ms late each, all done in %.0f ms\n",
              kWrites, kAckTimeoutMs / 5, MillisecondsSince(posted_at));
  for (const Completion& completion : events.completions()) {
    EXPECT_TRUE(completion.status.ok()) << completion.status;
  }
  EXPECT_EQ(source->counters(0).ack_timeouts, 0u);
  EXPECT_EQ(source->counters(0).transmitted_bytes, kWrites * source_bytes.size());
}

// Places "GOOD" at `offset` of `window` through `fd` and reads its ACK: proves the
// target serves the connection (it reads no WRITE before it has attached it).
void PlaceAndAck(int fd, WindowKey window, uint64_t offset, uint64_t wr_id) {
  const std::string write =
      AsString(wire::EncodeWrite(
          {.key = window, .offset = offset, .bytes = 4, .wr_id = wr_id})) +
      "GOOD";
  ASSERT_TRUE(SendRaw(fd, write.data(), write.size()).ok());
  wire::HeaderBytes header;
  ASSERT_TRUE(RecvAll(fd, header.data(), header.size()).ok());
  absl::StatusOr<wire::Header> decoded = wire::DecodeHeader(header, 0);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto* ack = std::get_if<wire::AckFrame>(&*decoded);
  ASSERT_NE(ack, nullptr);
  EXPECT_EQ(ack->wr_id, wr_id);
  EXPECT_EQ(ack->refusal, Refusal::kNone);
}

// A one-NIC fabric "target" on 127.0.0.3 that takes at most `share` connections of
// one peer.
std::unique_ptr<Fabric> TargetWithShare(KeyRing& keys, RecordingHandler& events,
                                        int share) {
  TcpFabricOptions options = LoopbackOptions("target", 3, keys, /*nic_count=*/1);
  options.max_connections_per_peer = share;
  return *CreateTcpFabric(options, &events);
}

// A peer opens connections until refused: the one past its share gets a REFUSE after
// its HELLO (the connector sees RESOURCE_EXHAUSTED, FABRIC_PEER_CONNECTIONS), counted;
// the earlier ones keep working.
TEST(TcpFabricBoundsTest, ConnectionsPastThePeersShareAreRefused) {
  constexpr int kShare = 2;
  KeyRing keys;
  std::vector<uint8_t> region(4096, kUntouched);  // outlives the fabric
  RecordingHandler events;
  std::unique_ptr<Fabric> target = TargetWithShare(keys, events, kShare);
  const RegionKey region_key =
      *target->RegisterRegion(region.data(), region.size(), nullptr);
  const Extent all{0, region.size()};
  const WindowKey window = *target->OpenWindow(region_key, "raw", {&all, 1});

  std::vector<UniqueFd> held;
  for (int i = 0; i < kShare; ++i) {
    absl::StatusOr<UniqueFd> raw = AuthenticatedRaw(keys, *target);
    ASSERT_TRUE(raw.ok()) << i << ": " << raw.status();
    held.push_back(*std::move(raw));
    PlaceAndAck(held.back().get(), window, 8 * i, i);  // attached before the next
  }
  absl::StatusOr<UniqueFd> refused = AuthenticatedRaw(keys, *target);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  EXPECT_EQ(ReasonOf(refused.status()), kPeerConnectionsReason);
  EXPECT_EQ(target->counters(0).peer_connection_refusals, 1u);
  EXPECT_EQ(target->counters(0).auth_failures, 0u);  // it did prove who it is

  // The earlier connections keep working.
  for (int i = 0; i < kShare; ++i) {
    PlaceAndAck(held[i].get(), window, 64 + 8 * i, 10 + i);
    EXPECT_EQ(std::string(region.begin() + 64 + 8 * i, region.begin() + 68 + 8 * i),
              "GOOD");
  }
  EXPECT_EQ(target->counters(0).peer_connection_refusals, 1u);
}

// Two connections of one peer pass their HELLO together with one place left: the
// second to prove itself gets a REFUSE after its PROOF, in place of an ACK, and is
// closed.
TEST(TcpFabricBoundsTest, ShareIsCheckedAgainAfterTheProof) {
  KeyRing keys;
  RecordingHandler events;
  std::unique_ptr<Fabric> target = TargetWithShare(keys, events, 1);
  const SessionKey key = *keys.For("raw")->FindConnectKey("target");

  // The late one's HELLO first, its CHALLENGE read; then the other proves itself.
  absl::StatusOr<UniqueFd> late = RawConnect(9, target->endpoints()[0]);
  ASSERT_TRUE(late.ok()) << late.status();
  handshake::Transcript transcript{.connector = "raw", .acceptor = "target", .nic = 0};
  const std::string hello = *wire::EncodeHello(0, "raw", transcript.client_nonce);
  ASSERT_TRUE(SendRaw(late->get(), hello.data(), hello.size()).ok());
  wire::HeaderBytes header;
  ASSERT_TRUE(RecvAll(late->get(), header.data(), header.size()).ok());
  absl::StatusOr<wire::Header> decoded = wire::DecodeHeader(header, 0);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto* challenge = std::get_if<wire::ChallengeHeader>(&*decoded);
  ASSERT_NE(challenge, nullptr);
  transcript.server_nonce = challenge->server_nonce;
  handshake::Mac mac_a;
  ASSERT_TRUE(RecvAll(late->get(), mac_a.data(), mac_a.size()).ok());

  absl::StatusOr<UniqueFd> first = AuthenticatedRaw(keys, *target);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(WaitUntil([&] { return target->FindPeer("raw").has_value(); }));

  const handshake::Mac mac_c =
      *handshake::ComputeMac(key, handshake::Side::kConnector, transcript);
  const std::string proof = wire::EncodeProof(mac_c);
  ASSERT_TRUE(SendRaw(late->get(), proof.data(), proof.size()).ok());
  ASSERT_TRUE(RecvAll(late->get(), header.data(), header.size()).ok());
  decoded = wire::DecodeHeader(header, 0);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto* refuse = std::get_if<wire::RefuseHeader>(&*decoded);
  ASSERT_NE(refuse, nullptr);
  const absl::Status refused = RefusedByAcceptor(refuse->why);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(ReasonOf(refused), kPeerConnectionsReason);
  EXPECT_TRUE(WaitUntilClosed(late->get()));
  EXPECT_TRUE(
      WaitUntil([&] { return target->counters(0).peer_connection_refusals == 1; }));
  EXPECT_EQ(target->counters(0).auth_failures, 0u);
  EXPECT_FALSE(ClosedNow(first->get()));
}

// A fabric's own Connect past its share on the target (a restarted node whose old
// connections the target still holds, here a second fabric of the same name): the
// Connect fails RESOURCE_EXHAUSTED with the reason, not a bare UNAVAILABLE.
TEST(TcpFabricBoundsTest, ConnectPastThePeersShareSaysWhy) {
  KeyRing keys;
  RecordingHandler events;
  std::unique_ptr<Fabric> target = TargetWithShare(keys, events, 1);
  auto source = [&](int host) {
    TcpFabricOptions options = LoopbackOptions("source", host, keys, /*nic_count=*/1);
    options.connections_per_nic = 1;
    return *CreateTcpFabric(options, &events);
  };
  std::unique_ptr<Fabric> first = source(5);
  ASSERT_TRUE(first->Connect("target", target->endpoints()).ok());
  ASSERT_TRUE(WaitUntil([&] { return target->FindPeer("source").has_value(); }));

  std::unique_ptr<Fabric> second = source(6);
  const absl::StatusOr<PeerId> refused = second->Connect("target", target->endpoints());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  EXPECT_EQ(ReasonOf(refused.status()), kPeerConnectionsReason);
  EXPECT_EQ(target->counters(0).peer_connection_refusals, 1u);
}

TEST(TcpFabricBoundsTest, DefaultShareIsTwiceWhatAPeerOpens) {
  KeyRing keys;
  TcpFabricOptions options = LoopbackOptions("target", 3, keys, /*nic_count=*/2);
  options.connections_per_nic = 3;
  EXPECT_EQ(DefaultConnectionsPerPeer(options), 12);
}

TEST(TcpFabricBoundsTest, BoundsOutOfRangeAreRefused) {
  KeyRing keys;
  RecordingHandler events;
  const TcpFabricOptions options = LoopbackOptions("a", 1, keys);
  TcpFabricOptions no_stall = options;
  no_stall.stall_timeout_ms = 0;
  TcpFabricOptions no_ack = options;
  no_ack.ack_timeout_ms = 0;
  TcpFabricOptions huge_ack = options;
  huge_ack.ack_timeout_ms = kMaxTimeoutMs + 1;
  TcpFabricOptions negative_share = options;
  negative_share.max_connections_per_peer = -1;
  for (const TcpFabricOptions& bad : {no_stall, no_ack, huge_ack, negative_share}) {
    EXPECT_EQ(CreateTcpFabric(bad, &events).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace fuselink::fabric
