#include "agent/fabric/verbs_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/fabric/little_endian.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric::verbs::wire {
namespace {

constexpr size_t kTypeAt = 6;
constexpr size_t kWordAt[4] = {8, 12, 16, 20};
constexpr size_t kDwordAt[3] = {24, 32, 40};
constexpr size_t kGidAt = 48;
// ibv_mtu runs IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5.
constexpr uint32_t kMinMtu = 1;
constexpr uint32_t kMaxMtu = 5;

Frame Empty(FrameType type) {
  Frame frame{};
  PutLe<uint32_t>(frame, 0, kMagic);
  PutLe<uint16_t>(frame, 4, kVersion);
  PutLe<uint16_t>(frame, kTypeAt, static_cast<uint16_t>(type));
  return frame;
}

// True when every byte of [from, to) is zero.
bool ZeroBetween(std::span<const uint8_t> in, size_t from, size_t to) {
  for (size_t i = from; i < to; ++i) {
    if (in[i] != 0) return false;
  }
  return true;
}

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("control frame: ", what));
}

}  // namespace

absl::StatusOr<std::string> EncodeHello(const Hello& hello) {
  if (!hello.name.empty()) {
    if (absl::Status valid = fabric::wire::ValidateNodeName(hello.name); !valid.ok()) {
      return valid;
    }
  }
  if (hello.qps.empty() || hello.qps.size() > kMaxQpsPerHello) {
    return absl::InvalidArgumentError(
        absl::StrCat("a HELLO carries 1..", kMaxQpsPerHello, " QPs"));
  }
  Frame frame = Empty(FrameType::kHello);
  PutLe<uint32_t>(frame, kWordAt[0], hello.nic);
  PutLe<uint32_t>(frame, kWordAt[1], static_cast<uint32_t>(hello.qps.size()));
  PutLe<uint32_t>(frame, kWordAt[2], hello.mtu);
  PutLe<uint32_t>(frame, kWordAt[3], static_cast<uint32_t>(hello.name.size()));
  std::memcpy(frame.data() + kGidAt, hello.gid.data(), kGidBytes);
  std::string out(frame.begin(), frame.end());
  out += hello.name;
  for (const QpInfo& qp : hello.qps) {
    std::array<uint8_t, kQpInfoBytes> record{};
    PutLe<uint32_t>(record, 0, qp.qpn);
    PutLe<uint32_t>(record, 4, qp.psn);
    out.append(record.begin(), record.end());
  }
  return out;
}

Frame EncodeRefuse(const Refuse& refuse) {
  Frame frame = Empty(FrameType::kRefuse);
  PutLe<uint32_t>(frame, kWordAt[0], static_cast<uint32_t>(refuse.code));
  return frame;
}

Frame EncodeRegionAdd(const RegionAdd& add) {
  Frame frame = Empty(FrameType::kRegionAdd);
  PutLe<uint32_t>(frame, kWordAt[0], add.key);
  PutLe<uint32_t>(frame, kWordAt[1], add.rkey);
  PutLe<uint64_t>(frame, kDwordAt[0], add.address);
  PutLe<uint64_t>(frame, kDwordAt[1], add.bytes);
  PutLe<uint64_t>(frame, kDwordAt[2], add.seq);
  return frame;
}

Frame EncodeRegionRemove(const RegionRemove& remove) {
  Frame frame = Empty(FrameType::kRegionRemove);
  PutLe<uint32_t>(frame, kWordAt[0], remove.key);
  PutLe<uint64_t>(frame, kDwordAt[2], remove.seq);
  return frame;
}

Frame EncodeReady() { return Empty(FrameType::kReady); }

Frame EncodeAck(const Ack& ack) {
  Frame frame = Empty(FrameType::kAck);
  PutLe<uint64_t>(frame, kDwordAt[2], ack.seq);
  return frame;
}

absl::StatusOr<Decoded> DecodeFrame(std::span<const uint8_t, kFrameBytes> in) {
  if (GetLe<uint32_t>(in, 0) != kMagic) return Bad("bad magic");
  if (GetLe<uint16_t>(in, 4) != kVersion) {
    return Bad(absl::StrCat("version ", GetLe<uint16_t>(in, 4), ", expected ", kVersion));
  }
  const uint32_t word0 = GetLe<uint32_t>(in, kWordAt[0]);
  switch (static_cast<FrameType>(GetLe<uint16_t>(in, kTypeAt))) {
    case FrameType::kHello: {
      HelloHeader hello{.nic = word0,
                        .qp_count = GetLe<uint32_t>(in, kWordAt[1]),
                        .mtu = GetLe<uint32_t>(in, kWordAt[2]),
                        .name_bytes = GetLe<uint32_t>(in, kWordAt[3])};
      if (!ZeroBetween(in, kDwordAt[0], kGidAt))
        return Bad("HELLO with unused fields set");
      if (hello.qp_count < 1 || hello.qp_count > kMaxQpsPerHello) {
        return Bad(absl::StrCat("HELLO with ", hello.qp_count, " QPs"));
      }
      if (hello.mtu < kMinMtu || hello.mtu > kMaxMtu) {
        return Bad(absl::StrCat("HELLO with MTU code ", hello.mtu));
      }
      if (hello.name_bytes > kMaxNameBytes) return Bad("HELLO name too long");
      std::memcpy(hello.gid.data(), in.data() + kGidAt, kGidBytes);
      return hello;
    }
    case FrameType::kRefuse: {
      if (!ZeroBetween(in, kWordAt[1], kFrameBytes)) return Bad("REFUSE with fields set");
      if (word0 == 0 ||
          word0 > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
        return Bad(absl::StrCat("REFUSE with code ", word0));
      }
      return Refuse{.code = static_cast<absl::StatusCode>(word0)};
    }
    case FrameType::kRegionAdd: {
      if (word0 == 0) return Bad("REGION_ADD for key 0");
      if (!ZeroBetween(in, kWordAt[2], kDwordAt[0]) ||
          !ZeroBetween(in, kGidAt, kFrameBytes)) {
        return Bad("REGION_ADD with unused fields set");
      }
      return RegionAdd{.key = word0,
                       .rkey = GetLe<uint32_t>(in, kWordAt[1]),
                       .address = GetLe<uint64_t>(in, kDwordAt[0]),
                       .bytes = GetLe<uint64_t>(in, kDwordAt[1]),
                       .seq = GetLe<uint64_t>(in, kDwordAt[2])};
    }
    case FrameType::kRegionRemove: {
      if (word0 == 0) return Bad("REGION_REMOVE for key 0");
      if (!ZeroBetween(in, kWordAt[1], kDwordAt[2]) ||
          !ZeroBetween(in, kGidAt, kFrameBytes)) {
        return Bad("REGION_REMOVE with unused fields set");
      }
      return RegionRemove{.key = word0, .seq = GetLe<uint64_t>(in, kDwordAt[2])};
    }
    case FrameType::kReady:
      if (!ZeroBetween(in, kWordAt[0], kFrameBytes)) return Bad("READY with fields set");
      return Ready{};
    case FrameType::kAck:
      if (!ZeroBetween(in, kWordAt[0], kDwordAt[2]) ||
          !ZeroBetween(in, kGidAt, kFrameBytes)) {
        return Bad("ACK with unused fields set");
      }
      return Ack{.seq = GetLe<uint64_t>(in, kDwordAt[2])};
  }
  return Bad(absl::StrCat("unknown type ", GetLe<uint16_t>(in, kTypeAt)));
}

std::vector<QpInfo> DecodeQpInfos(std::span<const uint8_t> bytes) {
  std::vector<QpInfo> out;
  for (size_t at = 0; at + kQpInfoBytes <= bytes.size(); at += kQpInfoBytes) {
    out.push_back(
        {.qpn = GetLe<uint32_t>(bytes, at), .psn = GetLe<uint32_t>(bytes, at + 4)});
  }
  return out;
}

}  // namespace fuselink::fabric::verbs::wire
