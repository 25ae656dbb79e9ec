// The TCP fabric's frames, as bytes. Pure: no sockets, no state.
//
// Every frame starts with a fixed kHeaderBytes header, all integers little-endian:
//   off size  field
//    0   u32  magic            kMagic
//    4   u16  version          kProtocolVersion
//    6   u16  type             FrameType
//    8   u32  word0            HELLO: nic        WRITE: window key  ACK: status code
//                              REFUSE: ConnectionRefusal
//   12   u32  word1            HELLO: name bytes WRITE: bytes       ACK: Refusal
//   16   u32  word2            HELLO: 0          WRITE: imm         ACK: 0
//   20   u32  reserved         0
//   24   16B  nonce            HELLO: client nonce       CHALLENGE: server nonce
//   24   u64  dword0           WRITE: offset      ACK: 0
//   32   u64  dword1           WRITE: wr_id       ACK: wr_id
// (bytes 24..40 are one 16-byte nonce in HELLO and CHALLENGE, two u64 otherwise;
// every field of CHALLENGE and PROOF but the nonce is 0, of REFUSE but word0.)
// HELLO is followed by `name bytes` of node name, WRITE by `bytes` of payload,
// CHALLENGE by kMacBytes of mac_a and PROOF by kMacBytes of mac_c (handshake.h); ACK
// and REFUSE have no body. Fields a type does not use must be zero, so that a later
// version can give them a meaning without old peers misreading it.
//
// A connection carries, from the connecting side: HELLO, PROOF, then WRITEs; from the
// accepting side: CHALLENGE (after the HELLO), then one ACK per WRITE, in the order
// the WRITEs arrived. The acceptor reads no WRITE before the PROOF checks; a HELLO
// from a node it holds no key for, a wrong PROOF, or no PROOF within kHelloTimeoutMs
// closes the connection. A connector it knows but will not take (it holds its share
// of connections) gets a REFUSE saying why, instead of the CHALLENGE or, when the
// share filled while it proved itself, instead of its first ACK; then the close.
// REFUSE came after version 3 without a new version: an older connector reads it as
// a malformed frame and fails as it did on the bare close. It is not signed, so it
// tells the connector no more than the close would (anyone on the path can close). An ACK
// with a refusal (a write outside every window the writer holds) says the target placed
// nothing and read past the payload: the connection goes on.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/common/limits.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/handshake.h"

namespace fuselink::fabric::wire {

inline constexpr uint32_t kMagic = 0x4B4E4C46;  // "FLNK" as little-endian bytes
// 2: windows and refusals. 3: CHALLENGE and PROOF (authenticated connections).
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr size_t kHeaderBytes = 40;
// Bounds a peer's HELLO, so that a hostile name cannot make us allocate much.
inline constexpr size_t kMaxNodeNameBytes = 255;
// The largest max_write_bytes a fabric may be configured with; a WRITE's length is a
// u32 on the wire and one write must fit in memory many times over.
inline constexpr uint32_t kMaxWriteBytesLimit = 1u << 30;

static_assert(kHeaderBytes ==
                  5 * sizeof(uint32_t) + sizeof(uint32_t) + 2 * sizeof(uint64_t),
              "the header layout above adds up to kHeaderBytes");
static_assert(kHeaderBytes % sizeof(uint64_t) == 0, "header keeps payloads aligned");
static_assert(kMaxNodeNameBytes <= UINT32_MAX, "a name length is a u32 on the wire");
static_assert(kMaxNodeNameBytes == handshake::kMaxNameBytes,
              "every name a HELLO carries can be MACed");
static_assert(handshake::kNonceBytes == 2 * sizeof(uint64_t),
              "a nonce fills dword0 and dword1");

enum class FrameType : uint16_t {
  kHello = 1,
  kWrite = 2,
  kAck = 3,
  kChallenge = 4,
  kProof = 5,
  kRefuse = 6,
};

// Why an acceptor refuses a connector it knows (REFUSE's word0).
enum class ConnectionRefusal : uint32_t {
  kPeerConnections = 1,  // the connector holds its share of connections already
};
inline constexpr uint32_t kMaxConnectionRefusal = 1;

// First frame of a connection: who is connecting, on which NIC index.
struct HelloHeader {
  uint32_t nic = 0;
  uint32_t name_bytes = 0;  // length of the node name that follows the header
  handshake::Nonce client_nonce{};
};

// The acceptor's answer to HELLO; mac_a follows the header.
struct ChallengeHeader {
  handshake::Nonce server_nonce{};
};

// The connector's answer to CHALLENGE; mac_c follows the header.
struct ProofHeader {};

// The acceptor's refusal of a connection, in place of a CHALLENGE or an ACK.
struct RefuseHeader {
  ConnectionRefusal why = ConnectionRefusal::kPeerConnections;
};

// A one-sided write; `bytes` of payload follow the header.
struct WriteHeader {
  RegionKey key = 0;
  uint64_t offset = 0;
  uint32_t bytes = 0;
  uint32_t imm = 0;
  uint64_t wr_id = 0;
};

// The target's answer to one WRITE: kOk once the bytes are placed; otherwise the
// refusal and its code (RefusalStatus), nothing placed.
struct AckFrame {
  uint64_t wr_id = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  Refusal refusal = Refusal::kNone;
};

using Header = std::variant<HelloHeader, WriteHeader, AckFrame, ChallengeHeader,
                            ProofHeader, RefuseHeader>;
using HeaderBytes = std::array<uint8_t, kHeaderBytes>;

// The header and name of a HELLO. INVALID_ARGUMENT when the name is not a valid
// node name or the NIC index is out of range.
absl::StatusOr<std::string> EncodeHello(uint32_t nic, absl::string_view node_name,
                                        const handshake::Nonce& client_nonce);
// Whole frames: header and MAC.
std::string EncodeChallenge(const handshake::Nonce& server_nonce,
                            const handshake::Mac& mac_a);
std::string EncodeProof(const handshake::Mac& mac_c);
HeaderBytes EncodeWrite(const WriteHeader& write);
HeaderBytes EncodeAck(const AckFrame& ack);
HeaderBytes EncodeRefuse(const RefuseHeader& refuse);

// Validates every field of a header: magic, version, type, unused fields zero,
// NIC index, name length in [1, kMaxNodeNameBytes], WRITE bytes <= max_write_bytes,
// ACK code a known absl::StatusCode, REFUSE a known ConnectionRefusal.
// INVALID_ARGUMENT on anything else.
absl::StatusOr<Header> DecodeHeader(std::span<const uint8_t, kHeaderBytes> bytes,
                                    uint32_t max_write_bytes);

// A node name is 1..kMaxNodeNameBytes printable ASCII characters.
absl::Status ValidateNodeName(absl::string_view name);

}  // namespace fuselink::fabric::wire
