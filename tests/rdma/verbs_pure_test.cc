// The verbs fabric's pure parts: control frames, wr_id encoding, GID choice, the
// source's window tables, the worker. No device.
#include <arpa/inet.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/little_endian.h"
#include "agent/fabric/verbs/device.h"
#include "agent/fabric/verbs/fabric.h"
#include "agent/fabric/verbs/nic.h"
#include "agent/fabric/verbs/staging.h"
#include "agent/fabric/verbs/window.h"
#include "agent/fabric/verbs/wire.h"
#include "agent/fabric/verbs/worker.h"
#include "agent/fabric/verbs/wrap.h"
#include "gtest/gtest.h"

namespace fuselink::fabric::verbs {
namespace {

TEST(VerbsWire, HelloRoundTrips) {
  wire::Hello hello{.nic = 1, .mtu = IBV_MTU_1024, .name = "node-a", .qps = {}};
  hello.gid[15] = 7;
  hello.qps = {{.qpn = 17, .psn = 0xABCDEF}, {.qpn = 18, .psn = 5}};
  absl::StatusOr<std::string> bytes = wire::EncodeHello(hello);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_EQ(bytes->size(), wire::kFrameBytes + 6 + 2 * wire::kQpInfoBytes);
  absl::StatusOr<wire::Decoded> decoded =
      wire::DecodeFrame(std::span<const uint8_t, wire::kFrameBytes>(
          reinterpret_cast<const uint8_t*>(bytes->data()), wire::kFrameBytes));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto& header = std::get<wire::HelloHeader>(*decoded);
  EXPECT_EQ(header.nic, 1u);
  EXPECT_EQ(header.qp_count, 2u);
  EXPECT_EQ(header.name_bytes, 6u);
  EXPECT_EQ(header.gid[15], 7);
  std::vector<wire::QpInfo> qps = wire::DecodeQpInfos(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(bytes->data()) + wire::kFrameBytes + 6,
      2 * wire::kQpInfoBytes));
  ASSERT_EQ(qps.size(), 2u);
  EXPECT_EQ(qps[0].qpn, 17u);
  EXPECT_EQ(qps[0].psn, 0xABCDEFu);
  EXPECT_EQ(header.client_nonce, handshake::Nonce{}) << "a reply's nonce is zero";
}

TEST(VerbsWire, HelloCarriesTheClientNonce) {
  wire::Hello hello{.nic = 0, .mtu = IBV_MTU_1024, .name = "a", .qps = {{.qpn = 1}}};
  for (size_t i = 0; i < hello.client_nonce.size(); ++i) {
    hello.client_nonce[i] = static_cast<uint8_t>(0xA0 + i);
  }
  absl::StatusOr<std::string> bytes = wire::EncodeHello(hello);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<wire::Decoded> decoded =
      wire::DecodeFrame(std::span<const uint8_t, wire::kFrameBytes>(
          reinterpret_cast<const uint8_t*>(bytes->data()), wire::kFrameBytes));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(std::get<wire::HelloHeader>(*decoded).client_nonce, hello.client_nonce);
}

TEST(VerbsWire, ChallengeAndProofRoundTrip) {
  wire::Challenge challenge;
  for (size_t i = 0; i < challenge.mac.size(); ++i) {
    challenge.mac[i] = static_cast<uint8_t>(i + 1);
  }
  for (size_t i = 0; i < challenge.server_nonce.size(); ++i) {
    challenge.server_nonce[i] = static_cast<uint8_t>(0xF0 + i);
  }
  absl::StatusOr<wire::Decoded> decoded =
      wire::DecodeFrame(wire::EncodeChallenge(challenge));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto& back = std::get<wire::Challenge>(*decoded);
  EXPECT_EQ(back.mac, challenge.mac);
  EXPECT_EQ(back.server_nonce, challenge.server_nonce);

  const wire::Proof proof{.mac = challenge.mac};
  decoded = wire::DecodeFrame(wire::EncodeProof(proof));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(std::get<wire::Proof>(*decoded).mac, proof.mac);
}

TEST(VerbsWire, RejectsChallengeAndProofWithUnusedFieldsSet) {
  wire::Frame challenge = wire::EncodeChallenge({});
  challenge[40] = 1;  // dword2
  EXPECT_FALSE(wire::DecodeFrame(challenge).ok());
  wire::Frame proof = wire::EncodeProof({});
  proof[48] = 1;  // where CHALLENGE has its nonce
  EXPECT_FALSE(wire::DecodeFrame(proof).ok());
  proof = wire::EncodeProof({});
  proof[44] = 1;
  EXPECT_FALSE(wire::DecodeFrame(proof).ok());
}

TEST(VerbsWire, RejectsVersionsTwoAndThree) {
  wire::Frame frame = wire::EncodeReady();
  frame[4] = 2;  // a peer from before authentication
  EXPECT_FALSE(wire::DecodeFrame(frame).ok());
  frame[4] = 3;  // a peer whose HELLO has no LID
  EXPECT_FALSE(wire::DecodeFrame(frame).ok());
}

absl::StatusOr<wire::Decoded> Decode(absl::string_view bytes) {
  return wire::DecodeFrame(std::span<const uint8_t, wire::kFrameBytes>(
      reinterpret_cast<const uint8_t*>(bytes.data()), wire::kFrameBytes));
}

TEST(VerbsWire, HelloCarriesTheLidAndNothingBesideIt) {
  wire::Hello hello{.nic = 0, .mtu = IBV_MTU_4096, .lid = 0xBEEF, .name = "", .qps = {}};
  hello.qps = {{.qpn = 1, .psn = 2}};
  absl::StatusOr<std::string> bytes = wire::EncodeHello(hello);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<wire::Decoded> decoded = Decode(*bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(std::get<wire::HelloHeader>(*decoded).lid, 0xBEEF);
  // The rest of that field must stay zero.
  std::string dirty = *bytes;
  dirty[42] = 1;
  EXPECT_FALSE(Decode(dirty).ok());
}

TEST(VerbsWire, WindowFramesRoundTrip) {
  const std::vector<wire::WindowRecord> records = {
      {.offset = 0, .bytes = 4096, .rkey = 0x1234},
      {.offset = 1ull << 40, .bytes = 1 << 20, .rkey = 0xFFFFFFFF}};
  absl::StatusOr<std::string> bytes =
      wire::EncodeWindowAdd(0xABCDEF01, 0x123, 9, records);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_EQ(bytes->size(), wire::kFrameBytes + 2 * wire::kWindowRecordBytes);
  absl::StatusOr<wire::Decoded> decoded = Decode(*bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto& add = std::get<wire::WindowAdd>(*decoded);
  EXPECT_EQ(add.key, 0xABCDEF01u);
  EXPECT_EQ(add.extent_count, 2u);
  EXPECT_EQ(add.seq, 9u);
  EXPECT_EQ(add.iova_base, 0x123u);
  absl::StatusOr<std::vector<wire::WindowRecord>> back =
      wire::DecodeWindowRecords(std::span<const uint8_t>(
          reinterpret_cast<const uint8_t*>(bytes->data()) + wire::kFrameBytes,
          2 * wire::kWindowRecordBytes));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].offset, 1ull << 40);
  EXPECT_EQ((*back)[1].bytes, 1u << 20);
  EXPECT_EQ((*back)[1].rkey, 0xFFFFFFFFu);

  decoded = wire::DecodeFrame(wire::EncodeWindowRemove({.key = 5, .seq = 10}));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(std::get<wire::WindowRemove>(*decoded).key, 5u);
  decoded = wire::DecodeFrame(wire::EncodeAck({.seq = 4}));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(std::get<wire::Ack>(*decoded).seq, 4u);
  decoded = wire::DecodeFrame(
      wire::EncodeQuery({.key = 7, .bytes = 100, .offset = 1ull << 33, .seq = 3}));
  ASSERT_TRUE(decoded.ok());
  const auto& query = std::get<wire::Query>(*decoded);
  EXPECT_EQ(query.key, 7u);
  EXPECT_EQ(query.bytes, 100u);
  EXPECT_EQ(query.offset, 1ull << 33);
  EXPECT_EQ(query.seq, 3u);
  for (Refusal r : {Refusal::kNone, Refusal::kNoWindow, Refusal::kNotYourWindow,
                    Refusal::kOutsideWindow}) {
    decoded = wire::DecodeFrame(wire::EncodeVerdict({.refusal = r, .seq = 8}));
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(std::get<wire::Verdict>(*decoded).refusal, r);
  }
  decoded = wire::DecodeFrame(
      wire::EncodeQpRenew({.index = 2, .qpn = 0x11, .psn = 0xFFFFFF, .seq = 6}));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(std::get<wire::QpRenew>(*decoded).psn, 0xFFFFFFu);
  decoded = wire::DecodeFrame(
      wire::EncodeQpRenewed({.index = 3, .qpn = 0x12, .psn = 1, .seq = 6}));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(std::get<wire::QpRenewed>(*decoded).index, 3u);
  EXPECT_EQ(std::get<wire::QpRenewed>(*decoded).qpn, 0x12u);
}

TEST(VerbsWire, RejectsBadWindowFrames) {
  const wire::WindowRecord one{.offset = 0, .bytes = 1, .rkey = 1};
  EXPECT_FALSE(wire::EncodeWindowAdd(0, 0, 1, {&one, 1}).ok()) << "key 0";
  EXPECT_FALSE(wire::EncodeWindowAdd(1, 0, 1, {}).ok()) << "no extents";
  absl::StatusOr<std::string> bytes = wire::EncodeWindowAdd(1, 0, 1, {&one, 1});
  ASSERT_TRUE(bytes.ok());
  std::string frame = *bytes;
  frame[12] = 0;  // extent count 0
  EXPECT_FALSE(Decode(frame).ok());
  frame = *bytes;
  PutLe<uint32_t>(std::span<uint8_t>(reinterpret_cast<uint8_t*>(frame.data()), 64), 12,
                  kMaxWindowExtents + 1);
  EXPECT_FALSE(Decode(frame).ok()) << "too many extents";
  frame = *bytes;
  frame[36] = 1;  // dword1: unused
  EXPECT_FALSE(Decode(frame).ok());
  std::vector<uint8_t> record(wire::kWindowRecordBytes, 0);
  record[20] = 1;  // padding
  EXPECT_FALSE(wire::DecodeWindowRecords(record).ok());
  record.pop_back();
  EXPECT_FALSE(wire::DecodeWindowRecords(record).ok()) << "torn record";
  wire::Frame verdict = wire::EncodeVerdict({.refusal = Refusal::kNoWindow});
  verdict[8] = kMaxRefusal + 1;
  EXPECT_FALSE(wire::DecodeFrame(verdict).ok());
  wire::Frame renew = wire::EncodeQpRenew({.psn = 1});
  renew[19] = 1;  // PSN past 24 bits
  EXPECT_FALSE(wire::DecodeFrame(renew).ok());
  EXPECT_FALSE(wire::DecodeFrame(wire::EncodeWindowRemove({.key = 0})).ok());
}

std::vector<wire::WindowRecord> Records(
    std::vector<std::pair<uint64_t, uint64_t>> extents) {
  std::vector<wire::WindowRecord> out;
  uint32_t rkey = 100;
  for (auto [offset, bytes] : extents) {
    out.push_back({.offset = offset, .bytes = bytes, .rkey = rkey++});
  }
  return out;
}

TEST(VerbsWindow, ResolvesTheOneExtentThatHoldsAWrite) {
  absl::StatusOr<RemoteWindow> window =
      RemoteWindow::FromRecords(0x10, Records({{0, 100}, {100, 50}, {1000, 24}}));
  ASSERT_TRUE(window.ok()) << window.status();
  auto at = [](uint64_t address, uint32_t rkey) {
    return RemoteTarget{.address = address, .rkey = rkey};
  };
  EXPECT_EQ(window->Resolve(0, 100), at(0x10, 100));
  EXPECT_EQ(window->Resolve(10, 1), at(0x1A, 100));
  EXPECT_EQ(window->Resolve(100, 50), at(0x74, 101));
  EXPECT_EQ(window->Resolve(1000, 24), at(1016, 102));
  EXPECT_EQ(window->Resolve(1023, 1), at(1039, 102));
  // Across two touching extents: separate registrations, so no single rkey holds it.
  EXPECT_EQ(window->Resolve(90, 20), std::nullopt);
  EXPECT_EQ(window->Resolve(150, 1), std::nullopt);   // the gap
  EXPECT_EQ(window->Resolve(1024, 1), std::nullopt);  // past the end
  EXPECT_EQ(window->Resolve(1000, 25), std::nullopt);
  EXPECT_EQ(window->Resolve(1000, UINT64_MAX), std::nullopt);  // no overflow
  EXPECT_EQ(window->Resolve(UINT64_MAX, 1), std::nullopt);
}

TEST(VerbsWindow, RefusesBadRecords) {
  EXPECT_FALSE(RemoteWindow::FromRecords(0, {}).ok());
  EXPECT_FALSE(RemoteWindow::FromRecords(0, Records({{0, 0}})).ok()) << "empty";
  EXPECT_FALSE(RemoteWindow::FromRecords(0, Records({{10, 5}, {0, 5}})).ok())
      << "unsorted";
  EXPECT_FALSE(RemoteWindow::FromRecords(0, Records({{0, 10}, {5, 10}})).ok())
      << "overlap";
  EXPECT_FALSE(RemoteWindow::FromRecords(0, Records({{UINT64_MAX - 1, 5}})).ok())
      << "wraps";
  EXPECT_FALSE(RemoteWindow::FromRecords(10, Records({{UINT64_MAX - 10, 5}})).ok())
      << "wraps with the iova base";
  std::vector<wire::WindowRecord> many(kMaxWindowExtents + 1);
  for (size_t i = 0; i < many.size(); ++i) many[i] = {.offset = i, .bytes = 1};
  EXPECT_FALSE(RemoteWindow::FromRecords(0, many).ok()) << "too many";
  many.pop_back();
  EXPECT_TRUE(RemoteWindow::FromRecords(0, many).ok());
}

TEST(VerbsWindow, TableAddsRemovesAndIsBounded) {
  RemoteWindowTable table;
  ASSERT_TRUE(table.Add(7, *RemoteWindow::FromRecords(0, Records({{0, 10}}))).ok());
  EXPECT_EQ(table.Resolve(7, 0, 10), (RemoteTarget{.address = 0, .rkey = 100}));
  EXPECT_EQ(table.Resolve(8, 0, 10), std::nullopt);
  // Replacing a key is not growth.
  ASSERT_TRUE(table.Add(7, *RemoteWindow::FromRecords(0, Records({{20, 10}}))).ok());
  EXPECT_EQ(table.Resolve(7, 0, 10), std::nullopt);
  EXPECT_EQ(table.Resolve(7, 20, 10), (RemoteTarget{.address = 20, .rkey = 100}));
  table.Remove(7);
  table.Remove(7);
  EXPECT_EQ(table.Resolve(7, 20, 10), std::nullopt);
  for (WindowKey key = 1; key <= kMaxRemoteWindowsPerLink; ++key) {
    ASSERT_TRUE(table.Add(key, *RemoteWindow::FromRecords(0, Records({{0, 1}}))).ok());
  }
  EXPECT_EQ(
      table.Add(0xFFFFFFF0, *RemoteWindow::FromRecords(0, Records({{0, 1}}))).code(),
      absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(table.Add(1, *RemoteWindow::FromRecords(0, Records({{0, 1}}))).ok());
  EXPECT_EQ(table.size(), kMaxRemoteWindowsPerLink);
}

TEST(VerbsWorker, RunsInOrderAndFinishesOnStop) {
  Worker worker("fl-test");
  std::vector<int> order;
  absl::Notification gate;
  worker.Run([&] { gate.WaitForNotification(); });
  for (int i = 0; i < 100; ++i) worker.Run([&order, i] { order.push_back(i); });
  gate.Notify();
  worker.Stop();  // runs all 100 first
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  bool inline_ran = false;
  worker.Run([&] { inline_ran = true; });  // after Stop: on this thread
  EXPECT_TRUE(inline_ran);
  worker.Stop();
}

TEST(VerbsWorker, TasksMayQueueTasks) {
  std::atomic<int> ran{0};
  {
    Worker worker("fl-test");
    worker.Run([&] {
      ++ran;
      worker.Run([&] { ++ran; });
    });
  }  // the destructor stops: both ran
  EXPECT_EQ(ran.load(), 2);
}

TEST(VerbsWire, RefuseSaysWhyWhereItCan) {
  absl::StatusOr<wire::Decoded> plain = wire::DecodeFrame(
      wire::EncodeRefuse({.code = absl::StatusCode::kUnavailable, .why = std::nullopt}));
  ASSERT_TRUE(plain.ok()) << plain.status();
  const auto* refuse = std::get_if<wire::Refuse>(&*plain);
  ASSERT_NE(refuse, nullptr);
  EXPECT_EQ(refuse->code, absl::StatusCode::kUnavailable);
  EXPECT_FALSE(refuse->why.has_value());

  wire::Frame share =
      wire::EncodeRefuse({.code = absl::StatusCode::kResourceExhausted,
                          .why = fabric::wire::ConnectionRefusal::kPeerConnections});
  EXPECT_EQ(GetLe<uint32_t>(share, 12), 1u) << "word1";
  absl::StatusOr<wire::Decoded> decoded = wire::DecodeFrame(share);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  refuse = std::get_if<wire::Refuse>(&*decoded);
  ASSERT_NE(refuse, nullptr);
  EXPECT_EQ(refuse->code, absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refuse->why, fabric::wire::ConnectionRefusal::kPeerConnections);

  PutLe<uint32_t>(share, 12, fabric::wire::kMaxConnectionRefusal + 1);
  EXPECT_EQ(wire::DecodeFrame(share).status().code(), absl::StatusCode::kInvalidArgument)
      << "an unknown refusal";
  share = wire::EncodeRefuse(
      {.code = absl::StatusCode::kResourceExhausted, .why = std::nullopt});
  share[16] = 1;  // word2: still unused
  EXPECT_EQ(wire::DecodeFrame(share).status().code(), absl::StatusCode::kInvalidArgument);
}

class NullHandler : public Handler {
 public:
  void OnCompletion(const Completion&) override {}
  void OnArrival(const Arrival&) override {}
  void OnPeerLost(PeerId, absl::string_view, const absl::Status&) override {}
};

TEST(VerbsFabricOptions, DefaultLinkShareIsTwiceWhatAPeerOpens) {
  VerbsFabricOptions options;
  options.nics.resize(3);
  EXPECT_EQ(DefaultLinksPerPeer(options), 6);
}

// Checked before any device is opened, so no device is needed.
TEST(VerbsFabricOptions, BoundsOutOfRangeAreRefused) {
  FabricKeys keys;
  NullHandler handler;
  for (auto tune : std::vector<std::function<void(VerbsFabricOptions&)>>{
           [](VerbsFabricOptions& o) { o.stall_timeout_ms = 0; },
           [](VerbsFabricOptions& o) { o.stall_timeout_ms = 3'600'001; },
           [](VerbsFabricOptions& o) { o.max_links_per_peer = -1; },
           [](VerbsFabricOptions& o) {
             o.max_links_per_peer = static_cast<int>(kMaxVerbsLinks) + 1;
           }}) {
    VerbsFabricOptions options;
    options.node_name = "a";
    options.keys = &keys;
    options.nics.push_back({.nic = 0, .address = "192.0.2.1"});
    tune(options);
    absl::StatusOr<std::unique_ptr<Fabric>> fabric = CreateVerbsFabric(options, &handler);
    EXPECT_EQ(fabric.status().code(), absl::StatusCode::kInvalidArgument)
        << fabric.status();
  }
}

TEST(VerbsWire, RejectsBadFrames) {
  wire::Frame frame = wire::EncodeReady();
  frame[0] ^= 1;
  EXPECT_EQ(wire::DecodeFrame(frame).status().code(), absl::StatusCode::kInvalidArgument);
  frame = wire::EncodeReady();
  frame[20] = 1;  // an unused field
  EXPECT_EQ(wire::DecodeFrame(frame).status().code(), absl::StatusCode::kInvalidArgument);
  wire::Hello hello{.nic = 0, .mtu = IBV_MTU_1024, .name = "a", .qps = {}};
  EXPECT_FALSE(wire::EncodeHello(hello).ok()) << "no QPs";
  hello.qps.resize(wire::kMaxQpsPerHello + 1);
  EXPECT_FALSE(wire::EncodeHello(hello).ok()) << "too many QPs";
  hello.qps.resize(1);
  hello.mtu = 9;
  absl::StatusOr<std::string> bytes = wire::EncodeHello(hello);
  ASSERT_TRUE(bytes.ok());
  EXPECT_FALSE(wire::DecodeFrame(std::span<const uint8_t, wire::kFrameBytes>(
                                     reinterpret_cast<const uint8_t*>(bytes->data()),
                                     wire::kFrameBytes))
                   .ok())
      << "MTU code 9";
}

TEST(VerbsWrId, RoundTripsAtTheBounds) {
  const wr_id::Fields fields{.slot = kMaxWrDepth - 1,
                             .qp = kMaxQpsPerNic - 1,
                             .generation = wr_id::kGenerationMask,
                             .payload = true,
                             .recv = true};
  const wr_id::Fields back = wr_id::Decode(wr_id::Encode(fields));
  EXPECT_EQ(back.slot, fields.slot);
  EXPECT_EQ(back.qp, fields.qp);
  EXPECT_EQ(back.generation, fields.generation);
  EXPECT_TRUE(back.payload);
  EXPECT_TRUE(back.recv);
  static_assert(wr_id::Decode(wr_id::Encode({.slot = 5, .qp = 6})).qp == 6);
}

TEST(VerbsGid, ChoosesTheRoceV2EntryOfTheAddress) {
  absl::StatusOr<ibv_gid> gid = Ipv4MappedGid("10.1.0.2");
  ASSERT_TRUE(gid.ok());
  EXPECT_EQ(GidToString(*gid), "::ffff:10.1.0.2");
  absl::StatusOr<ibv_gid> other = Ipv4MappedGid("10.1.0.1");
  ASSERT_TRUE(other.ok());
  std::vector<GidEntry> table = {
      {.gid = {},
       .index = 0,
       .type = IBV_GID_TYPE_ROCE_V2,
       .netdev = ""},  // link-local-ish
      {.gid = *gid,
       .index = 1,
       .type = IBV_GID_TYPE_ROCE_V1,
       .netdev = ""},  // same GID, v1
      {.gid = *other,
       .index = 2,
       .type = IBV_GID_TYPE_ROCE_V2,
       .netdev = ""},  // another address
      {.gid = *gid, .index = 3, .type = IBV_GID_TYPE_ROCE_V2, .netdev = ""},  // the one
  };
  EXPECT_EQ(ChooseRoceV2Gid(table, *gid), 3u);
  table.pop_back();
  EXPECT_EQ(ChooseRoceV2Gid(table, *gid), std::nullopt);
  EXPECT_FALSE(Ipv4MappedGid("fe80::1").ok());
}

// An IPv6 GID as the kernel lists it (sysfs gids/N, inet_pton's bytes).
ibv_gid Gid6(const char* text) {
  ibv_gid gid{};
  EXPECT_EQ(inet_pton(AF_INET6, text, gid.raw), 1) << text;
  return gid;
}

// What rxe's GID table holds for a netdev with 10.1.0.2 and fd00:fe:1::2: the
// link-local default GID of its MAC, then each address as RoCE v1 and v2.
std::vector<GidEntry> DualStackTable() {
  return {
      {.gid = Gid6("fe80::5054:ff:fe12:3456"),
       .index = 0,
       .type = IBV_GID_TYPE_ROCE_V1,
       .netdev = "vB1"},
      {.gid = Gid6("fe80::5054:ff:fe12:3456"),
       .index = 1,
       .type = IBV_GID_TYPE_ROCE_V2,
       .netdev = "vB1"},
      {.gid = *Ipv4MappedGid("10.1.0.2"),
       .index = 2,
       .type = IBV_GID_TYPE_ROCE_V1,
       .netdev = "vB1"},
      {.gid = *Ipv4MappedGid("10.1.0.2"),
       .index = 3,
       .type = IBV_GID_TYPE_ROCE_V2,
       .netdev = "vB1"},
      {.gid = Gid6("fd00:fe:1::2"),
       .index = 4,
       .type = IBV_GID_TYPE_ROCE_V1,
       .netdev = "vB1"},
      {.gid = Gid6("fd00:fe:1::2"),
       .index = 5,
       .type = IBV_GID_TYPE_ROCE_V2,
       .netdev = "vB1"},
  };
}

TEST(VerbsGid, AnIpv6AddressIsItsOwnGid) {
  absl::StatusOr<ibv_gid> gid = AddressGid("fd00:fe:1::2");
  ASSERT_TRUE(gid.ok()) << gid.status();
  EXPECT_EQ(std::memcmp(gid->raw, Gid6("fd00:fe:1::2").raw, 16), 0);
  EXPECT_EQ(GidToString(*gid), "fd00:fe:1::2");
  // Another spelling of the same address is the same GID.
  absl::StatusOr<ibv_gid> long_form = AddressGid("FD00:00FE:0001:0:0:0:0:0002");
  ASSERT_TRUE(long_form.ok()) << long_form.status();
  EXPECT_EQ(std::memcmp(long_form->raw, gid->raw, 16), 0);
  absl::StatusOr<ibv_gid> global = AddressGid("2001:db8::7");
  ASSERT_TRUE(global.ok()) << global.status();
  EXPECT_EQ(GidToString(*global), "2001:db8::7");
}

TEST(VerbsGid, ChoosesTheRoceV2EntryOfAnIpv6Address) {
  const std::vector<GidEntry> table = DualStackTable();
  EXPECT_EQ(ChooseRoceV2Gid(table, *AddressGid("fd00:fe:1::2")), 5u);
  // IPv4 unchanged, beside an IPv6 address on the same netdev.
  EXPECT_EQ(ChooseRoceV2Gid(table, *AddressGid("10.1.0.2")), 3u);
  EXPECT_EQ(std::memcmp(AddressGid("10.1.0.2")->raw, Ipv4MappedGid("10.1.0.2")->raw, 16),
            0);
  // An address no entry has: none (BindAddress answers NOT_FOUND).
  EXPECT_EQ(ChooseRoceV2Gid(table, *AddressGid("fd00:fe:1::3")), std::nullopt);
  EXPECT_EQ(ChooseRoceV2Gid(table, *AddressGid("fd00:fe:2::2")), std::nullopt);
  // Only RoCE v1 carries it: none.
  std::vector<GidEntry> v1_only = table;
  v1_only.pop_back();
  EXPECT_EQ(ChooseRoceV2Gid(v1_only, *AddressGid("fd00:fe:1::2")), std::nullopt);
}

TEST(VerbsGid, RefusesIpv6AddressesThatCannotNameANic) {
  for (const char* link_local : {"fe80::5054:ff:fe12:3456", "fe80::1", "febf::1"}) {
    absl::StatusOr<ibv_gid> gid = AddressGid(link_local);
    EXPECT_EQ(gid.status().code(), absl::StatusCode::kInvalidArgument) << link_local;
    EXPECT_EQ(ReasonOf(gid.status()), "LINK_LOCAL_ADDRESS") << link_local;
    EXPECT_NE(gid.status().message().find("link-local"), absl::string_view::npos);
  }
  // With a scope id it is not even an address inet_pton reads.
  EXPECT_EQ(AddressGid("fe80::1%vA0").status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const char* unfit : {"ff02::1", "::", "::ffff:10.1.0.2", "10.1.0", "vB1", ""}) {
    EXPECT_EQ(AddressGid(unfit).status().code(), absl::StatusCode::kInvalidArgument)
        << unfit;
  }
  EXPECT_TRUE(AddressGid("fec0::1").ok());  // fe80::/10 only: fec0:: is not in it
}

TEST(VerbsAddress, CarriesTheTrafficClassAndServiceLevel) {
  RemoteQp remote{.qpn = 7, .psn = 9, .gid = *Ipv4MappedGid("10.0.0.2")};
  RcParams params{.port = 2, .gid_index = 3, .traffic_class = 106, .service_level = 3};
  const ibv_ah_attr ah = RcAddressVector(params, remote);
  EXPECT_EQ(ah.is_global, 1);
  EXPECT_EQ(std::memcmp(ah.grh.dgid.raw, remote.gid.raw, sizeof(remote.gid.raw)), 0);
  EXPECT_EQ(ah.grh.sgid_index, 3);
  EXPECT_EQ(ah.grh.traffic_class, 106);  // DSCP 26 (106 >> 2), ECN bits 10
  EXPECT_EQ(ah.sl, 3);
  EXPECT_EQ(ah.port_num, 2);
  EXPECT_EQ(ah.grh.hop_limit, 64);
  // The defaults: best effort, lane 0.
  const ibv_ah_attr plain = RcAddressVector(RcParams{}, remote);
  EXPECT_EQ(plain.grh.traffic_class, 0);
  EXPECT_EQ(plain.sl, 0);
}

// Nothing in the address vector assumes an IPv4-mapped GID: an IPv6 peer's GID is the
// GRH's destination as it is, and the local GID index picks the IPv6 source (the
// kernel takes the packet's IP version from that GID entry).
TEST(VerbsAddress, AnIpv6PeerIsTheGrhDestination) {
  RemoteQp remote{.qpn = 7, .psn = 9, .gid = *AddressGid("fd00:fe:1::1")};
  const ibv_ah_attr ah = RcAddressVector(RcParams{.port = 1, .gid_index = 5}, remote);
  EXPECT_EQ(ah.is_global, 1);
  EXPECT_EQ(GidToString(ah.grh.dgid), "fd00:fe:1::1");
  EXPECT_EQ(ah.grh.sgid_index, 5);
  EXPECT_EQ(ah.grh.hop_limit, 64);
  EXPECT_EQ(ah.dlid, 0);
}

TEST(VerbsAddress, InfinibandGoesByLidWithoutAGrh) {
  RemoteQp remote{.qpn = 7, .psn = 9, .lid = 0x1234};
  RcParams params{.port = 1, .service_level = 5, .infiniband = true};
  const ibv_ah_attr ah = RcAddressVector(params, remote);
  EXPECT_EQ(ah.is_global, 0);
  EXPECT_EQ(ah.src_path_bits, 0);
  EXPECT_EQ(ah.grh.traffic_class, 0);
  EXPECT_EQ(ah.grh.hop_limit, 0);
  EXPECT_EQ(ah.dlid, 0x1234);
  EXPECT_EQ(ah.sl, 5);
  EXPECT_EQ(ah.port_num, 1);
}

TEST(VerbsDevice, FindsTheInfinibandPortBehindAnIpoibInterface) {
  const std::string hca = "/sys/devices/pci0000:00/0000:00:02.0/0000:41:00.0";
  auto port = [&](std::string device, uint8_t number, uint8_t link_layer) {
    VerbsPort p;
    p.device = std::move(device);
    p.port = number;
    p.link_layer = link_layer;
    p.pci_path = hca;
    return p;
  };
  const std::vector<VerbsPort> ports = {port("mlx5_0", 1, IBV_LINK_LAYER_ETHERNET),
                                        port("mlx5_1", 1, IBV_LINK_LAYER_INFINIBAND),
                                        port("mlx5_1", 2, IBV_LINK_LAYER_INFINIBAND)};
  EXPECT_EQ(ChooseIpoibPort(ports, hca, 0), 1u);  // ib0: port 1
  EXPECT_EQ(ChooseIpoibPort(ports, hca, 1), 2u);  // ib1: port 2
  EXPECT_EQ(ChooseIpoibPort(ports, hca, 2), std::nullopt);
  EXPECT_EQ(ChooseIpoibPort(ports, "/sys/devices/other", 0), std::nullopt);
  EXPECT_EQ(ChooseIpoibPort(ports, "", 0), std::nullopt);  // a virtual interface
  EXPECT_EQ(ChooseIpoibPort(ports, hca, -1), std::nullopt);
}

// The best path a (GPU, NIC) pair's probe found wins; staging needs a stager.
TEST(GpuPath, TheBestPathTheProbeFoundWins) {
  using verbs::GpuPath;
  EXPECT_EQ(verbs::ChooseGpuPath({}), GpuPath::kNone);
  EXPECT_EQ(verbs::ChooseGpuPath({.stager = true}), GpuPath::kStaged);
  EXPECT_EQ(verbs::ChooseGpuPath({.peer_memory_registers = true, .stager = true}),
            GpuPath::kPeerMemory);
  EXPECT_EQ(
      verbs::ChooseGpuPath(
          {.dmabuf_registers = true, .peer_memory_registers = true, .stager = true}),
      GpuPath::kDmabuf);
  EXPECT_EQ(verbs::GpuPathName(GpuPath::kDmabuf), "dma-buf");
  EXPECT_EQ(verbs::GpuPathName(GpuPath::kPeerMemory), "peer-memory");
  EXPECT_EQ(verbs::GpuPathName(GpuPath::kStaged), "staged");
  EXPECT_EQ(verbs::GpuPathName(GpuPath::kNone), "none");
}

// Without a stager nothing is probed; a stager without device memory (the stand-in)
// leaves staging as the only path.
TEST(GpuPath, AProbeWithoutDeviceMemoryFindsStagingOnly) {
  EXPECT_EQ(verbs::ChooseGpuPath(verbs::ProbeGpuPath(nullptr, 0, nullptr, true)),
            verbs::GpuPath::kNone);
  class NoDeviceMemory final : public DeviceStager {
   public:
    absl::StatusOr<std::unique_ptr<DeviceStage>> NewStage(int) override {
      return absl::UnimplementedError("no stages");
    }
    absl::StatusOr<std::shared_ptr<uint8_t>> AllocatePinned(int, uint64_t) override {
      return absl::UnimplementedError("no pinned memory");
    }
  } stager;
  EXPECT_EQ(verbs::ChooseGpuPath(verbs::ProbeGpuPath(&stager, 0, nullptr, true)),
            verbs::GpuPath::kStaged);
}

TEST(GpuPath, PeerMemoryIsTheLoadedModule) {
  const std::string root = ::testing::TempDir() + "/peermem-sysfs";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/module/nvidia");
  EXPECT_FALSE(verbs::PeerMemoryLoaded(root));
  std::filesystem::create_directories(root + "/module/nvidia_peermem");
  EXPECT_TRUE(verbs::PeerMemoryLoaded(root));
  std::filesystem::remove_all(root + "/module/nvidia_peermem");
  std::filesystem::create_directories(root + "/module/nv_peer_mem");
  EXPECT_TRUE(verbs::PeerMemoryLoaded(root));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace fuselink::fabric::verbs
