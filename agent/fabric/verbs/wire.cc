#include "agent/fabric/verbs/wire.h"

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
constexpr size_t kNonceAt = kDwordAt[0];   // HELLO: the client nonce
constexpr size_t kMacAt = kWordAt[0];      // CHALLENGE, PROOF
constexpr size_t kServerNonceAt = kGidAt;  // CHALLENGE
// ibv_mtu runs IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5.
constexpr uint32_t kMinMtu = 1;
constexpr uint32_t kMaxMtu = 5;
constexpr uint32_t kMaxPsn = (1u << 24) - 1;

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
  PutLe<uint16_t>(frame, kDwordAt[2], hello.lid);
  std::memcpy(frame.data() + kGidAt, hello.gid.data(), kGidBytes);
  std::memcpy(frame.data() + kNonceAt, hello.client_nonce.data(),
              hello.client_nonce.size());
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
  if (refuse.why.has_value()) {
    PutLe<uint32_t>(frame, kWordAt[1], static_cast<uint32_t>(*refuse.why));
  }
  return frame;
}

Frame EncodeChallenge(const Challenge& challenge) {
  Frame frame = Empty(FrameType::kChallenge);
  std::memcpy(frame.data() + kMacAt, challenge.mac.data(), challenge.mac.size());
  std::memcpy(frame.data() + kServerNonceAt, challenge.server_nonce.data(),
              challenge.server_nonce.size());
  return frame;
}

Frame EncodeProof(const Proof& proof) {
  Frame frame = Empty(FrameType::kProof);
  std::memcpy(frame.data() + kMacAt, proof.mac.data(), proof.mac.size());
  return frame;
}

absl::StatusOr<std::string> EncodeWindowAdd(WindowKey key, uint64_t iova_base,
                                            uint64_t seq,
                                            std::span<const WindowRecord> records) {
  if (key == 0) return absl::InvalidArgumentError("a WINDOW_ADD for key 0");
  if (records.empty() || records.size() > kMaxWindowExtents) {
    return absl::InvalidArgumentError(
        absl::StrCat("a WINDOW_ADD carries 1..", kMaxWindowExtents, " extents"));
  }
  Frame frame = Empty(FrameType::kWindowAdd);
  PutLe<uint32_t>(frame, kWordAt[0], key);
  PutLe<uint32_t>(frame, kWordAt[1], static_cast<uint32_t>(records.size()));
  PutLe<uint64_t>(frame, kDwordAt[0], iova_base);
  PutLe<uint64_t>(frame, kDwordAt[2], seq);
  std::string out(frame.begin(), frame.end());
  out.reserve(kFrameBytes + records.size() * kWindowRecordBytes);
  for (const WindowRecord& record : records) {
    std::array<uint8_t, kWindowRecordBytes> bytes{};
    PutLe<uint64_t>(bytes, 0, record.offset);
    PutLe<uint64_t>(bytes, 8, record.bytes);
    PutLe<uint32_t>(bytes, 16, record.rkey);
    out.append(bytes.begin(), bytes.end());
  }
  return out;
}

Frame EncodeWindowRemove(const WindowRemove& remove) {
  Frame frame = Empty(FrameType::kWindowRemove);
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

Frame EncodeQuery(const Query& query) {
  Frame frame = Empty(FrameType::kQuery);
  PutLe<uint32_t>(frame, kWordAt[0], query.key);
  PutLe<uint32_t>(frame, kWordAt[1], query.bytes);
  PutLe<uint64_t>(frame, kDwordAt[0], query.offset);
  PutLe<uint64_t>(frame, kDwordAt[2], query.seq);
  return frame;
}

Frame EncodeVerdict(const Verdict& verdict) {
  Frame frame = Empty(FrameType::kVerdict);
  PutLe<uint32_t>(frame, kWordAt[0], static_cast<uint32_t>(verdict.refusal));
  PutLe<uint64_t>(frame, kDwordAt[2], verdict.seq);
  return frame;
}

namespace {
Frame EncodeRenewal(FrameType type, uint32_t index, uint32_t qpn, uint32_t psn,
                    uint64_t seq) {
  Frame frame = Empty(type);
  PutLe<uint32_t>(frame, kWordAt[0], index);
  PutLe<uint32_t>(frame, kWordAt[1], qpn);
  PutLe<uint32_t>(frame, kWordAt[2], psn);
  PutLe<uint64_t>(frame, kDwordAt[2], seq);
  return frame;
}
}  // namespace

Frame EncodeQpRenew(const QpRenew& renew) {
  return EncodeRenewal(FrameType::kQpRenew, renew.index, renew.qpn, renew.psn, renew.seq);
}

Frame EncodeQpRenewed(const QpRenewed& renewed) {
  return EncodeRenewal(FrameType::kQpRenewed, renewed.index, renewed.qpn, renewed.psn,
                       renewed.seq);
}

namespace {
absl::StatusOr<Decoded> DecodeRefuse(std::span<const uint8_t, kFrameBytes> in) {
  if (!ZeroBetween(in, kWordAt[2], kFrameBytes)) return Bad("REFUSE with fields set");
  const uint32_t code = GetLe<uint32_t>(in, kWordAt[0]);
  if (code == 0 || code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return Bad(absl::StrCat("REFUSE with code ", code));
  }
  Refuse refuse{.code = static_cast<absl::StatusCode>(code), .why = std::nullopt};
  const uint32_t why = GetLe<uint32_t>(in, kWordAt[1]);
  if (why > fabric::wire::kMaxConnectionRefusal) {
    return Bad(absl::StrCat("REFUSE with refusal ", why));
  }
  if (why != 0) refuse.why = static_cast<fabric::wire::ConnectionRefusal>(why);
  return refuse;
}
}  // namespace

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
                        .name_bytes = GetLe<uint32_t>(in, kWordAt[3]),
                        .lid = GetLe<uint16_t>(in, kDwordAt[2])};
      if (!ZeroBetween(in, kDwordAt[2] + 2, kGidAt)) {
        return Bad("HELLO with unused fields set");
      }
      std::memcpy(hello.client_nonce.data(), in.data() + kNonceAt,
                  hello.client_nonce.size());
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
    case FrameType::kRefuse:
      return DecodeRefuse(in);
    case FrameType::kWindowAdd: {
      const uint32_t count = GetLe<uint32_t>(in, kWordAt[1]);
      if (word0 == 0) return Bad("WINDOW_ADD for key 0");
      if (count < 1 || count > kMaxWindowExtents) {
        return Bad(absl::StrCat("WINDOW_ADD with ", count, " extents"));
      }
      if (!ZeroBetween(in, kWordAt[2], kDwordAt[0]) ||
          !ZeroBetween(in, kDwordAt[1], kDwordAt[2]) ||
          !ZeroBetween(in, kGidAt, kFrameBytes)) {
        return Bad("WINDOW_ADD with unused fields set");
      }
      return WindowAdd{.key = word0,
                       .extent_count = count,
                       .iova_base = GetLe<uint64_t>(in, kDwordAt[0]),
                       .seq = GetLe<uint64_t>(in, kDwordAt[2])};
    }
    case FrameType::kWindowRemove: {
      if (word0 == 0) return Bad("WINDOW_REMOVE for key 0");
      if (!ZeroBetween(in, kWordAt[1], kDwordAt[2]) ||
          !ZeroBetween(in, kGidAt, kFrameBytes)) {
        return Bad("WINDOW_REMOVE with unused fields set");
      }
      return WindowRemove{.key = word0, .seq = GetLe<uint64_t>(in, kDwordAt[2])};
    }
    case FrameType::kQuery: {
      if (!ZeroBetween(in, kWordAt[2], kDwordAt[0]) ||
          !ZeroBetween(in, kDwordAt[1], kDwordAt[2]) ||
          !ZeroBetween(in, kGidAt, kFrameBytes)) {
        return Bad("QUERY with unused fields set");
      }
      return Query{.key = word0,
                   .bytes = GetLe<uint32_t>(in, kWordAt[1]),
                   .offset = GetLe<uint64_t>(in, kDwordAt[0]),
                   .seq = GetLe<uint64_t>(in, kDwordAt[2])};
    }
    case FrameType::kVerdict: {
      if (word0 > kMaxRefusal) return Bad(absl::StrCat("VERDICT with refusal ", word0));
      if (!ZeroBetween(in, kWordAt[1], kDwordAt[2]) ||
          !ZeroBetween(in, kGidAt, kFrameBytes)) {
        return Bad("VERDICT with unused fields set");
      }
      return Verdict{.refusal = static_cast<Refusal>(word0),
                     .seq = GetLe<uint64_t>(in, kDwordAt[2])};
    }
    case FrameType::kQpRenew:
    case FrameType::kQpRenewed: {
      const uint32_t qpn = GetLe<uint32_t>(in, kWordAt[1]);
      const uint32_t psn = GetLe<uint32_t>(in, kWordAt[2]);
      const uint64_t seq = GetLe<uint64_t>(in, kDwordAt[2]);
      if (psn > kMaxPsn) return Bad(absl::StrCat("QP renewal with PSN ", psn));
      if (!ZeroBetween(in, kWordAt[3], kDwordAt[2]) ||
          !ZeroBetween(in, kGidAt, kFrameBytes)) {
        return Bad("QP renewal with unused fields set");
      }
      if (static_cast<FrameType>(GetLe<uint16_t>(in, kTypeAt)) == FrameType::kQpRenew) {
        return QpRenew{.index = word0, .qpn = qpn, .psn = psn, .seq = seq};
      }
      return QpRenewed{.index = word0, .qpn = qpn, .psn = psn, .seq = seq};
    }
    case FrameType::kChallenge: {
      constexpr size_t kMacEnd = kMacAt + handshake::kMacBytes;
      if (!ZeroBetween(in, kMacEnd, kServerNonceAt)) {
        return Bad("CHALLENGE with unused fields set");
      }
      Challenge challenge;
      std::memcpy(challenge.mac.data(), in.data() + kMacAt, challenge.mac.size());
      std::memcpy(challenge.server_nonce.data(), in.data() + kServerNonceAt,
                  challenge.server_nonce.size());
      return challenge;
    }
    case FrameType::kProof: {
      if (!ZeroBetween(in, kMacAt + handshake::kMacBytes, kFrameBytes)) {
        return Bad("PROOF with unused fields set");
      }
      Proof proof;
      std::memcpy(proof.mac.data(), in.data() + kMacAt, proof.mac.size());
      return proof;
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

absl::StatusOr<std::vector<WindowRecord>> DecodeWindowRecords(
    std::span<const uint8_t> bytes) {
  if (bytes.size() % kWindowRecordBytes != 0) return Bad("torn window records");
  std::vector<WindowRecord> out;
  out.reserve(bytes.size() / kWindowRecordBytes);
  for (size_t at = 0; at < bytes.size(); at += kWindowRecordBytes) {
    if (GetLe<uint32_t>(bytes, at + 20) != 0) return Bad("window record padding set");
    out.push_back({.offset = GetLe<uint64_t>(bytes, at),
                   .bytes = GetLe<uint64_t>(bytes, at + 8),
                   .rkey = GetLe<uint32_t>(bytes, at + 16)});
  }
  return out;
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
