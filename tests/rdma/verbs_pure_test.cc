// The verbs fabric's pure parts: control frames, wr_id encoding, GID choice. No device.
#include <cstring>

#include "agent/fabric/verbs_device.h"
#include "agent/fabric/verbs_nic.h"
#include "agent/fabric/verbs_wire.h"
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
}

TEST(VerbsWire, RegionFramesRoundTrip) {
  wire::Frame frame = wire::EncodeRegionAdd(
      {.key = 3, .rkey = 0x1234, .address = 0xDEADBEEF000, .bytes = 1 << 20, .seq = 9});
  absl::StatusOr<wire::Decoded> decoded = wire::DecodeFrame(frame);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto& add = std::get<wire::RegionAdd>(*decoded);
  EXPECT_EQ(add.key, 3u);
  EXPECT_EQ(add.rkey, 0x1234u);
  EXPECT_EQ(add.address, 0xDEADBEEF000u);
  EXPECT_EQ(add.bytes, 1u << 20);
  EXPECT_EQ(add.seq, 9u);
  decoded = wire::DecodeFrame(wire::EncodeAck({.seq = 4}));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(std::get<wire::Ack>(*decoded).seq, 4u);
}

TEST(VerbsWire, RejectsBadFrames) {
  wire::Frame frame = wire::EncodeReady();
  frame[0] ^= 1;
  EXPECT_EQ(wire::DecodeFrame(frame).status().code(), absl::StatusCode::kInvalidArgument);
  frame = wire::EncodeReady();
  frame[20] = 1;  // an unused field
  EXPECT_EQ(wire::DecodeFrame(frame).status().code(), absl::StatusCode::kInvalidArgument);
  frame = wire::EncodeRegionAdd({.key = 0});
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

}  // namespace
}  // namespace fuselink::fabric::verbs
