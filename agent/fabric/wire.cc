#include "agent/fabric/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/fabric/little_endian.h"

namespace fuselink::fabric::wire {
namespace {

// Field offsets inside the header; see the table in wire.h.
constexpr size_t kMagicAt = 0;
constexpr size_t kVersionAt = 4;
constexpr size_t kTypeAt = 6;
constexpr size_t kWord0At = 8;
constexpr size_t kWord1At = 12;
constexpr size_t kWord2At = 16;
constexpr size_t kReservedAt = 20;
constexpr size_t kDword0At = 24;
constexpr size_t kDword1At = 32;
constexpr size_t kNonceAt = kDword0At;  // HELLO, CHALLENGE: dword0 and dword1
static_assert(kDword1At + sizeof(uint64_t) == kHeaderBytes, "fields fill the header");

// The largest absl::StatusCode an ACK may carry.
constexpr uint32_t kMaxStatusCode =
    static_cast<uint32_t>(absl::StatusCode::kUnauthenticated);

HeaderBytes EmptyHeader(FrameType type) {
  HeaderBytes out{};
  PutLe<uint32_t>(out, kMagicAt, kMagic);
  PutLe<uint16_t>(out, kVersionAt, kProtocolVersion);
  PutLe<uint16_t>(out, kTypeAt, static_cast<uint16_t>(type));
  return out;
}

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed frame: ", what));
}

}  // namespace

absl::Status ValidateNodeName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNodeNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node name must be 1..", kMaxNodeNameBytes, " bytes, is ", name.size()));
  }
  for (char c : name) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError("node name must be printable ASCII");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeHello(uint32_t nic, absl::string_view node_name,
                                        const handshake::Nonce& client_nonce) {
  if (absl::Status valid = ValidateNodeName(node_name); !valid.ok()) return valid;
  if (nic >= kMaxWireNics) {
    return absl::InvalidArgumentError(
        absl::StrCat("NIC index ", nic, " >= ", kMaxWireNics));
  }
  HeaderBytes header = EmptyHeader(FrameType::kHello);
  PutLe<uint32_t>(header, kWord0At, nic);
  PutLe<uint32_t>(header, kWord1At, static_cast<uint32_t>(node_name.size()));
  std::memcpy(header.data() + kNonceAt, client_nonce.data(), client_nonce.size());
  std::string frame(reinterpret_cast<const char*>(header.data()), header.size());
  frame.append(node_name.data(), node_name.size());
  return frame;
}

namespace {
std::string WithMac(const HeaderBytes& header, const handshake::Mac& mac) {
  std::string frame(reinterpret_cast<const char*>(header.data()), header.size());
  frame.append(reinterpret_cast<const char*>(mac.data()), mac.size());
  return frame;
}
}  // namespace

std::string EncodeChallenge(const handshake::Nonce& server_nonce,
                            const handshake::Mac& mac_a) {
  HeaderBytes header = EmptyHeader(FrameType::kChallenge);
  std::memcpy(header.data() + kNonceAt, server_nonce.data(), server_nonce.size());
  return WithMac(header, mac_a);
}

std::string EncodeProof(const handshake::Mac& mac_c) {
  return WithMac(EmptyHeader(FrameType::kProof), mac_c);
}

HeaderBytes EncodeWrite(const WriteHeader& write) {
  HeaderBytes header = EmptyHeader(FrameType::kWrite);
  PutLe<uint32_t>(header, kWord0At, write.key);
  PutLe<uint32_t>(header, kWord1At, write.bytes);
  PutLe<uint32_t>(header, kWord2At, write.imm);
  PutLe<uint64_t>(header, kDword0At, write.offset);
  PutLe<uint64_t>(header, kDword1At, write.wr_id);
  return header;
}

HeaderBytes EncodeAck(const AckFrame& ack) {
  HeaderBytes header = EmptyHeader(FrameType::kAck);
  PutLe<uint32_t>(header, kWord0At, static_cast<uint32_t>(ack.code));
  PutLe<uint32_t>(header, kWord1At, static_cast<uint32_t>(ack.refusal));
  PutLe<uint64_t>(header, kDword1At, ack.wr_id);
  return header;
}

HeaderBytes EncodeRefuse(const RefuseHeader& refuse) {
  HeaderBytes header = EmptyHeader(FrameType::kRefuse);
  PutLe<uint32_t>(header, kWord0At, static_cast<uint32_t>(refuse.why));
  return header;
}

absl::StatusOr<Header> DecodeHeader(std::span<const uint8_t, kHeaderBytes> bytes,
                                    uint32_t max_write_bytes) {
  const auto magic = GetLe<uint32_t>(bytes, kMagicAt);
  if (magic != kMagic) return Malformed(absl::StrCat("bad magic 0x", absl::Hex(magic)));
  const auto version = GetLe<uint16_t>(bytes, kVersionAt);
  if (version != kProtocolVersion) {
    return Malformed(
        absl::StrCat("protocol version ", version, ", expected ", kProtocolVersion));
  }
  if (GetLe<uint32_t>(bytes, kReservedAt) != 0) return Malformed("reserved field set");

  const auto word0 = GetLe<uint32_t>(bytes, kWord0At);
  const auto word1 = GetLe<uint32_t>(bytes, kWord1At);
  const auto word2 = GetLe<uint32_t>(bytes, kWord2At);
  const auto dword0 = GetLe<uint64_t>(bytes, kDword0At);
  const auto dword1 = GetLe<uint64_t>(bytes, kDword1At);
  const auto type = GetLe<uint16_t>(bytes, kTypeAt);
  switch (static_cast<FrameType>(type)) {
    case FrameType::kHello: {
      if (word2 != 0) return Malformed("HELLO with unused fields set");
      if (word0 >= kMaxWireNics)
        return Malformed(absl::StrCat("HELLO NIC index ", word0));
      if (word1 == 0 || word1 > kMaxNodeNameBytes) {
        return Malformed(absl::StrCat("HELLO name length ", word1));
      }
      HelloHeader hello{.nic = word0, .name_bytes = word1};
      std::memcpy(hello.client_nonce.data(), bytes.data() + kNonceAt,
                  hello.client_nonce.size());
      return hello;
    }
    case FrameType::kChallenge: {
      if (word0 != 0 || word1 != 0 || word2 != 0) {
        return Malformed("CHALLENGE with unused fields set");
      }
      ChallengeHeader challenge;
      std::memcpy(challenge.server_nonce.data(), bytes.data() + kNonceAt,
                  challenge.server_nonce.size());
      return challenge;
    }
    case FrameType::kProof:
      if (word0 != 0 || word1 != 0 || word2 != 0 || dword0 != 0 || dword1 != 0) {
        return Malformed("PROOF with unused fields set");
      }
      return ProofHeader{};
    case FrameType::kWrite:
      if (word1 > max_write_bytes) {
        return Malformed(absl::StrCat("WRITE of ", word1, " bytes > max_write_bytes ",
                                      max_write_bytes));
      }
      return WriteHeader{
          .key = word0, .offset = dword0, .bytes = word1, .imm = word2, .wr_id = dword1};
    case FrameType::kAck:
      if (word2 != 0 || dword0 != 0) return Malformed("ACK with unused fields set");
      if (word0 > kMaxStatusCode) return Malformed(absl::StrCat("ACK status ", word0));
      if (word1 > kMaxRefusal) return Malformed(absl::StrCat("ACK refusal ", word1));
      if ((word1 != 0) != (word0 != 0)) {
        return Malformed("ACK refusal and status disagree");
      }
      return AckFrame{.wr_id = dword1,
                      .code = static_cast<absl::StatusCode>(word0),
                      .refusal = static_cast<Refusal>(word1)};
    case FrameType::kRefuse:
      if (word1 != 0 || word2 != 0 || dword0 != 0 || dword1 != 0) {
        return Malformed("REFUSE with unused fields set");
      }
      if (word0 == 0 || word0 > kMaxConnectionRefusal) {
        return Malformed(absl::StrCat("REFUSE for reason ", word0));
      }
      return RefuseHeader{.why = static_cast<ConnectionRefusal>(word0)};
  }
  return Malformed(absl::StrCat("unknown frame type ", type));
}

}  // namespace fuselink::fabric::wire
