#include "agent/fabric/verbs_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
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

template <typename T>
void Put(std::span<uint8_t> out, size_t at, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out[at + i] = static_cast<uint8_t>(value >> (8 * i));
}
template <typename T>
T Get(std::span<const uint8_t> in, size_t at) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(in[at + i]) << (8 * i);
  return value;
}

Frame Empty(FrameType type) {
  Frame frame{};
  Put<uint32_t>(frame, 0, kMagic);
  Put<uint16_t>(frame, 4, kVersion);
  Put<uint16_t>(frame, kTypeAt, static_cast<uint16_t>(type));
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
  Put<uint32_t>(frame, kWordAt[0], hello.nic);
  Put<uint32_t>(frame, kWordAt[1], static_cast<uint32_t>(hello.qps.size()));
  Put<uint32_t>(frame, kWordAt[2], hello.mtu);
  Put<uint32_t>(frame, kWordAt[3], static_cast<uint32_t>(hello.name.size()));
  std::memcpy(frame.data() + kGidAt, hello.gid.data(), kGidBytes);
  std::string out(frame.begin(), frame.end());
  out += hello.name;
  for (const QpInfo& qp : hello.qps) {
    std::array<uint8_t, kQpInfoBytes> record{};
    Put<uint32_t>(record, 0, qp.qpn);
    Put<uint32_t>(record, 4, qp.psn);
    out.append(record.begin(), record.end());
  }
  return out;
}

Frame EncodeRefuse(const Refuse& refuse) {
  Frame frame = Empty(FrameType::kRefuse);
  Put<uint32_t>(frame, kWordAt[0], static_cast<uint32_t>(refuse.code));
  return frame;
}

Frame EncodeRegionAdd(const RegionAdd& add) {
  Frame frame = Empty(FrameType::kRegionAdd);
  Put<uint32_t>(frame, kWordAt[0], add.key);
  Put<uint32_t>(frame, kWordAt[1], add.rkey);
  Put<uint64_t>(frame, kDwordAt[0], add.address);
  Put<uint64_t>(frame, kDwordAt[1], add.bytes);
  Put<uint64_t>(frame, kDwordAt[2], add.seq);
  return frame;
}

Frame EncodeRegionRemove(const RegionRemove& remove) {
  Frame frame = Empty(FrameType::kRegionRemove);
  Put<uint32_t>(frame, kWordAt[0], remove.key);
  Put<uint64_t>(frame, kDwordAt[2], remove.seq);
  return frame;
}

Frame EncodeReady() { return Empty(FrameType::kReady); }

Frame EncodeAck(const Ack& ack) {
  Frame frame = Empty(FrameType::kAck);
  Put<uint64_t>(frame, kDwordAt[2], ack.seq);
  return frame;
}

absl::StatusOr<Decoded> DecodeFrame(std::span<const uint8_t, kFrameBytes> in) {
  if (Get<uint32_t>(in, 0) != kMagic) return Bad("bad magic");
  if (Get<uint16_t>(in, 4) != kVersion) {
    return Bad(absl::StrCat("version ", Get<uint16_t>(in, 4), ", expected ", kVersion));
  }
  const uint32_t word0 = Get<uint32_t>(in, kWordAt[0]);
  switch (static_cast<FrameType>(Get<uint16_t>(in, kTypeAt))) {
    case FrameType::kHello: {
      HelloHeader hello{.nic = word0,
                        .qp_count = Get<uint32_t>(in, kWordAt[1]),
                        .mtu = Get<uint32_t>(in, kWordAt[2]),
                        .name_bytes = Get<uint32_t>(in, kWordAt[3])};
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
                       .rkey = Get<uint32_t>(in, kWordAt[1]),
                       .address = Get<uint64_t>(in, kDwordAt[0]),
                       .bytes = Get<uint64_t>(in, kDwordAt[1]),
                       .seq = Get<uint64_t>(in, kDwordAt[2])};
    }
    case FrameType::kRegionRemove: {
      if (word0 == 0) return Bad("REGION_REMOVE for key 0");
      if (!ZeroBetween(in, kWordAt[1], kDwordAt[2]) ||
          !ZeroBetween(in, kGidAt, kFrameBytes)) {
        return Bad("REGION_REMOVE with unused fields set");
      }
      return RegionRemove{.key = word0, .seq = Get<uint64_t>(in, kDwordAt[2])};
    }
    case FrameType::kReady:
      if (!ZeroBetween(in, kWordAt[0], kFrameBytes)) return Bad("READY with fields set");
      return Ready{};
    case FrameType::kAck:
      if (!ZeroBetween(in, kWordAt[0], kDwordAt[2]) ||
          !ZeroBetween(in, kGidAt, kFrameBytes)) {
        return Bad("ACK with unused fields set");
      }
      return Ack{.seq = Get<uint64_t>(in, kDwordAt[2])};
  }
  return Bad(absl::StrCat("unknown type ", Get<uint16_t>(in, kTypeAt)));
}

std::vector<QpInfo> DecodeQpInfos(std::span<const uint8_t> bytes) {
  std::vector<QpInfo> out;
  for (size_t at = 0; at + kQpInfoBytes <= bytes.size(); at += kQpInfoBytes) {
    out.push_back({.qpn = Get<uint32_t>(bytes, at), .psn = Get<uint32_t>(bytes, at + 4)});
  }
  return out;
}

}  // namespace fuselink::fabric::verbs::wire
