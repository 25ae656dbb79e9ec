// Two TCP fabrics in one process, on loopback addresses, two NICs each.
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/tcp/fabric.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"

namespace fuselink::fabric {
namespace {

using testing::LoopbackOptions;
using testing::RecordingHandler;

constexpr uint8_t kUntouched = 0xAB;

std::vector<uint8_t> RandomBytes(size_t bytes, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<uint8_t> out(bytes);
  for (uint8_t& byte : out) byte = static_cast<uint8_t>(random());
  return out;
}

// Source fabric "a" on 127.0.0.1-2, target fabric "b" on 127.0.0.3-4; `a` connected
// to `b`.
class TcpFabricTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Fabric>> a =
        CreateTcpFabric(LoopbackOptions("a", 1, keys_), &a_events_);
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = *std::move(a);
    absl::StatusOr<std::unique_ptr<Fabric>> b =
        CreateTcpFabric(LoopbackOptions("b", 3, keys_), &b_events_);
    ASSERT_TRUE(b.ok()) << b.status();
    b_ = *std::move(b);
    absl::StatusOr<PeerId> peer = a_->Connect("b", b_->endpoints());
    ASSERT_TRUE(peer.ok()) << peer.status();
    b_on_a_ = *peer;
  }

  testing::KeyRing keys_;     // outlives the fabrics
  testing::Buffers buffers_;  // outlives the fabrics
  RecordingHandler a_events_;
  RecordingHandler b_events_;
  std::unique_ptr<Fabric> a_;
  std::unique_ptr<Fabric> b_;
  PeerId b_on_a_ = 0;
};

TEST_F(TcpFabricTest, ReportsItsEndpoints) {
  EXPECT_EQ(a_->transport(), "tcp");
  ASSERT_EQ(a_->nic_count(), 2);
  std::vector<Endpoint> endpoints = a_->endpoints();
  ASSERT_EQ(endpoints.size(), 2u);
  EXPECT_EQ(endpoints[1].nic, 1);
  EXPECT_EQ(endpoints[1].address, "127.0.0.2");
  EXPECT_NE(endpoints[0].port, 0);
  EXPECT_NE(endpoints[1].port, 0);
  EXPECT_EQ(a_->PeerName(b_on_a_), "b");
}

TEST_F(TcpFabricTest, WritesLandExactlyAndNowhereElse) {
  constexpr size_t kWrites = 256;
  constexpr size_t kSlotBytes = 16 << 10;
  constexpr size_t kRegionBytes = kWrites * kSlotBytes;
  const std::vector<uint8_t>& source = buffers_.Keep(RandomBytes(kRegionBytes, 1));
  std::vector<uint8_t>& target =
      buffers_.Keep(std::vector<uint8_t>(kRegionBytes, kUntouched));
  std::vector<uint8_t> expected = target;
  RegionKey source_key =
      *a_->RegisterRegion(const_cast<uint8_t*>(source.data()), source.size(), nullptr);
  RegionKey target_key = *b_->RegisterRegion(target.data(), target.size(), nullptr);
  const Extent all{0, target.size()};
  const WindowKey target_window = *b_->OpenWindow(target_key, "a", {&all, 1});

  // One write per slot, at a random place inside it, so writes never overlap and
  // their order does not matter; gaps between them must stay untouched.
  std::mt19937 random(2);
  uint64_t bytes_per_nic[2] = {0, 0};
  for (size_t i = 0; i < kWrites; ++i) {
    const uint32_t bytes = 1 + random() % (kSlotBytes - 1);
    const uint64_t remote_offset = i * kSlotBytes + random() % (kSlotBytes - bytes + 1);
    const uint64_t local_offset = random() % (kRegionBytes - bytes + 1);
    std::memcpy(&expected[remote_offset], &source[local_offset], bytes);
    const int nic = static_cast<int>(i % 2);
    bytes_per_nic[nic] += bytes;
    ASSERT_TRUE(a_->PostWrite(b_on_a_, nic,
                              {.local_key = source_key,
                               .local_offset = local_offset,
                               .remote_key = target_window,
                               .remote_offset = remote_offset,
                               .bytes = bytes,
                               .imm = static_cast<uint32_t>(1000 + i),
                               .wr_id = i})
                    .ok());
  }
  ASSERT_TRUE(a_events_.WaitForCompletions(kWrites));
  ASSERT_TRUE(b_events_.WaitForArrivals(kWrites));

  std::set<uint64_t> completed;
  for (const Completion& completion : a_events_.completions()) {
    EXPECT_TRUE(completion.status.ok()) << completion.status;
    EXPECT_EQ(completion.nic, static_cast<int>(completion.wr_id % 2));
    completed.insert(completion.wr_id);
  }
  EXPECT_EQ(completed.size(), kWrites);
  EXPECT_TRUE(target == expected) << "target bytes differ";

  const PeerId a_on_b = b_events_.arrivals().front().peer;
  EXPECT_EQ(b_->PeerName(a_on_b), "a");
  for (const Arrival& arrival : b_events_.arrivals()) {
    EXPECT_EQ(arrival.peer, a_on_b);
    EXPECT_EQ(arrival.window, target_window);
    const size_t i = arrival.imm - 1000;
    ASSERT_LT(i, kWrites);
    EXPECT_EQ(arrival.nic, static_cast<int>(i % 2));
    EXPECT_EQ(arrival.offset / kSlotBytes, i);
  }
  for (int nic = 0; nic < 2; ++nic) {
    EXPECT_EQ(a_->counters(nic).transmitted_bytes, bytes_per_nic[nic]);
    EXPECT_EQ(b_->counters(nic).received_bytes, bytes_per_nic[nic]);
    EXPECT_EQ(a_->counters(nic).wire_tx_bytes, bytes_per_nic[nic]);
    EXPECT_EQ(b_->counters(nic).wire_rx_bytes, bytes_per_nic[nic]);
    EXPECT_EQ(b_->counters(nic).malformed_frames, 0u);
  }
}

TEST_F(TcpFabricTest, LargeWriteLands) {
  constexpr size_t kBytes = 24 << 20;  // several socket buffers
  const std::vector<uint8_t>& source = buffers_.Keep(RandomBytes(kBytes, 3));
  std::vector<uint8_t>& target =
      buffers_.Keep(std::vector<uint8_t>(kBytes + 2, kUntouched));
  RegionKey source_key =
      *a_->RegisterRegion(const_cast<uint8_t*>(source.data()), source.size(), nullptr);
  RegionKey target_key = *b_->RegisterRegion(target.data(), target.size(), nullptr);
  const Extent inner{1, kBytes};
  const WindowKey window = *b_->OpenWindow(target_key, "a", {&inner, 1});
  ASSERT_TRUE(a_->PostWrite(b_on_a_, 1,
                            {.local_key = source_key,
                             .remote_key = window,
                             .remote_offset = 1,
                             .bytes = kBytes,
                             .wr_id = 7})
                  .ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(1));
  EXPECT_TRUE(a_events_.completions()[0].status.ok());
  EXPECT_EQ(target.front(), kUntouched);
  EXPECT_EQ(target.back(), kUntouched);
  EXPECT_TRUE(std::equal(source.begin(), source.end(), target.begin() + 1));
}

TEST_F(TcpFabricTest, NotificationCarriesTheImmediate) {
  ASSERT_TRUE(a_->PostWrite(b_on_a_, 0, {.imm = 0xC0FFEE, .wr_id = 9}).ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(1));
  ASSERT_TRUE(b_events_.WaitForArrivals(1));
  const Completion completion = a_events_.completions()[0];
  EXPECT_TRUE(completion.status.ok());
  EXPECT_EQ(completion.wr_id, 9u);
  EXPECT_EQ(completion.bytes, 0u);
  const Arrival arrival = b_events_.arrivals()[0];
  EXPECT_EQ(arrival.imm, 0xC0FFEEu);
  EXPECT_EQ(arrival.bytes, 0u);
  EXPECT_EQ(arrival.nic, 0);
}

TEST_F(TcpFabricTest, ConnectIsIdempotentAndPeersShareIds) {
  EXPECT_EQ(*a_->Connect("b", b_->endpoints()), b_on_a_);
  // b learns "a" from the HELLOs; connecting back reuses that peer.
  ASSERT_TRUE(a_->PostWrite(b_on_a_, 0, {.wr_id = 1}).ok());
  ASSERT_TRUE(b_events_.WaitForArrivals(1));
  const PeerId a_on_b = b_events_.arrivals()[0].peer;
  absl::StatusOr<PeerId> back = b_->Connect("a", a_->endpoints());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, a_on_b);
  ASSERT_TRUE(b_->PostWrite(a_on_b, 1, {.imm = 5, .wr_id = 2}).ok());
  ASSERT_TRUE(a_events_.WaitForArrivals(1));
  EXPECT_EQ(a_events_.arrivals()[0].peer, b_on_a_);
}

TEST_F(TcpFabricTest, PostWriteRejectsBadArguments) {
  std::vector<uint8_t>& source = buffers_.Keep(std::vector<uint8_t>(64));
  RegionKey key = *a_->RegisterRegion(source.data(), source.size(), nullptr);
  const WriteOp fits{.local_key = key, .local_offset = 0, .remote_key = 1, .bytes = 64};
  WriteOp past_end = fits;
  past_end.local_offset = 1;
  WriteOp unknown_key = fits;
  unknown_key.local_key = key + 100;
  WriteOp oversize = fits;
  oversize.bytes = TcpFabricOptions().max_write_bytes + 1;
  EXPECT_EQ(a_->PostWrite(b_on_a_, 0, past_end).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->PostWrite(b_on_a_, 0, unknown_key).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->PostWrite(b_on_a_, 0, oversize).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->PostWrite(b_on_a_, 2, fits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->PostWrite(b_on_a_ + 100, 0, fits).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(a_events_.completions().empty());
}

TEST_F(TcpFabricTest, FailedConnectRollsBackAndNamesTheNic) {
  // NIC 1 of "c" has a bound socket that does not listen: connecting is refused
  // after NIC 0's connections are already open.
  absl::StatusOr<SocketAddress> dead_address = ParseSocketAddress("127.0.0.4", 0);
  ASSERT_TRUE(dead_address.ok());
  UniqueFd dead(socket(AF_INET, SOCK_STREAM, 0));
  ASSERT_EQ(bind(dead.get(), reinterpret_cast<const sockaddr*>(&dead_address->storage),
                 dead_address->length),
            0);
  const uint16_t dead_port = LocalAddress(dead.get())->port();
  std::vector<Endpoint> remote = b_->endpoints();
  remote[1].port = dead_port;
  RecordingHandler c_events;
  std::unique_ptr<Fabric> c = *CreateTcpFabric(LoopbackOptions("c", 7, keys_), &c_events);
  absl::StatusOr<PeerId> peer = c->Connect("b", remote);
  ASSERT_EQ(peer.status().code(), absl::StatusCode::kUnavailable) << peer.status();
  EXPECT_NE(peer.status().message().find("NIC 1"), std::string::npos) << peer.status();
  EXPECT_NE(peer.status().message().find(absl::StrCat("127.0.0.4:", dead_port)),
            std::string::npos)
      << peer.status();
  // The NIC 0 connections were closed: b saw "c" come and go.
  ASSERT_TRUE(b_events_.WaitForPeersLost(1));
  EXPECT_EQ(b_events_.peers_lost()[0].second.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(c_events.completions().empty());
  EXPECT_TRUE(c_events.peers_lost().empty());  // c never had the peer
  // Other peers are unaffected.
  ASSERT_TRUE(a_->PostWrite(b_on_a_, 1, {.wr_id = 3}).ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(1));
  EXPECT_TRUE(a_events_.completions()[0].status.ok());
}

TEST_F(TcpFabricTest, DisconnectLosesThePeerOnBothSides) {
  ASSERT_TRUE(a_->PostWrite(b_on_a_, 0, {.wr_id = 1}).ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(1));
  a_->Disconnect(b_on_a_);
  ASSERT_TRUE(a_events_.WaitForPeersLost(1));
  EXPECT_EQ(a_events_.peers_lost()[0].first, b_on_a_);
  EXPECT_EQ(a_events_.peers_lost()[0].second.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(b_events_.WaitForPeersLost(1));
  EXPECT_EQ(b_events_.peers_lost()[0].second.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a_->PostWrite(b_on_a_, 0, {.wr_id = 2}).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(a_->PeerName(b_on_a_), "");
  EXPECT_EQ(a_events_.peer_lost_names()[0], "b");

  absl::StatusOr<PeerId> again = a_->Connect("b", b_->endpoints());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(*again, b_on_a_);  // ids are never reused
  ASSERT_TRUE(a_->PostWrite(*again, 0, {.wr_id = 3}).ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(2));
  EXPECT_TRUE(a_events_.completions()[1].status.ok());
}

TEST_F(TcpFabricTest, WindowOutlivesItsRegionsDeregistration) {
  std::vector<uint8_t>& source = buffers_.Keep(RandomBytes(128, 4));
  std::vector<uint8_t>& target = buffers_.Keep(std::vector<uint8_t>(128, kUntouched));
  RegionKey source_key = *a_->RegisterRegion(source.data(), source.size(), nullptr);
  RegionKey target_key = *b_->RegisterRegion(target.data(), target.size(), nullptr);
  const Extent all{0, 128};
  const WindowKey window = *b_->OpenWindow(target_key, "a", {&all, 1});
  ASSERT_TRUE(b_->DeregisterRegion(target_key).ok());
  EXPECT_EQ(b_->OpenWindow(target_key, "a", {&all, 1}).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(
      a_->PostWrite(
            b_on_a_, 0,
            {.local_key = source_key, .remote_key = window, .bytes = 128, .wr_id = 1})
          .ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(1));
  EXPECT_TRUE(a_events_.completions()[0].status.ok())
      << a_events_.completions()[0].status;
  EXPECT_TRUE(target == source);
}

TEST_F(TcpFabricTest, ClosedWindowRefusesAndDrainsOnce) {
  std::vector<uint8_t>& source = buffers_.Keep(RandomBytes(128, 5));
  std::vector<uint8_t>& target = buffers_.Keep(std::vector<uint8_t>(128, kUntouched));
  RegionKey source_key = *a_->RegisterRegion(source.data(), source.size(), nullptr);
  RegionKey target_key = *b_->RegisterRegion(target.data(), target.size(), nullptr);
  const Extent all{0, 128};
  const WindowKey window = *b_->OpenWindow(target_key, "a", {&all, 1});
  int drained = 0;
  b_->CloseWindow(window, [&drained] { ++drained; });
  EXPECT_EQ(drained, 1);  // nothing was placing
  ASSERT_TRUE(
      a_->PostWrite(
            b_on_a_, 0,
            {.local_key = source_key, .remote_key = window, .bytes = 128, .wr_id = 1})
          .ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(1));
  const Completion refused = a_events_.completions()[0];
  EXPECT_EQ(refused.refusal, Refusal::kNoWindow);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReasonOf(refused.status), "WINDOW_CLOSED");
  EXPECT_TRUE(std::all_of(target.begin(), target.end(),
                          [](uint8_t byte) { return byte == kUntouched; }));
  EXPECT_TRUE(b_events_.arrivals().empty());
  b_->CloseWindow(window, [&drained] { ++drained; });  // unknown now: at once
  EXPECT_EQ(drained, 2);
  // The connection goes on: the next write on it lands.
  ASSERT_TRUE(a_->PostWrite(b_on_a_, 0, {.wr_id = 2}).ok());
  ASSERT_TRUE(a_events_.WaitForCompletions(2));
  EXPECT_TRUE(a_events_.completions()[1].status.ok());
  EXPECT_TRUE(a_events_.peers_lost().empty());
  EXPECT_EQ(b_->counters(0).malformed_frames, 0u);
  EXPECT_EQ(b_->counters(0).refused_writes, 1u);
  // The refused write was not delivered, but its 128 bytes crossed the link both
  // ways round: the kernel's counters hold them (the foreign-traffic watch).
  EXPECT_EQ(a_->counters(0).transmitted_bytes, 0u);
  EXPECT_EQ(b_->counters(0).received_bytes, 0u);
  EXPECT_EQ(a_->counters(0).wire_tx_bytes, 128u);
  EXPECT_EQ(b_->counters(0).wire_rx_bytes, 128u);
}

}  // namespace
}  // namespace fuselink::fabric
