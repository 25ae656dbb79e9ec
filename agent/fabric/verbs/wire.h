// The verbs fabric's control channel, as bytes. Pure: no sockets, no verbs calls.
//
// RC QPs need QPN, PSN, GID and MTU from the far side before they can move to RTR, and
// a source needs, for every window a target opens for it, one rkey per extent on each
// NIC. Both travel on one small TCP connection per (peer, NIC) — the NIC's Endpoint,
// as for the TCP fabric — never on the data path. All data goes over the RC QPs.
//
// Every frame is kFrameBytes, little-endian:
//   off size  field
//    0   u32  magic     kMagic
//    4   u16  version   kVersion
//    6   u16  type      FrameType
//    8   u32  word0     HELLO: nic   WINDOW_*: window key   REFUSE: status code
//                       VERDICT: refusal   QP_RENEW(ED): QP index in the link
//   12   u32  word1     HELLO: qp count   WINDOW_ADD: extent count   QUERY: bytes
//                       QP_RENEW(ED): qpn   REFUSE: fabric::wire::ConnectionRefusal
//                       (0: not said)
//   16   u32  word2     HELLO: mtu (ibv_mtu enum)   QP_RENEW(ED): psn
//   20   u32  word3     HELLO: name bytes
//   24   u64  dword0    QUERY: offset in the window's region   WINDOW_ADD: iova base
//   32   u64  dword1    (unused)
//   24   16B  nonce     HELLO: the connector's client nonce (0 in the reply)
//   40   u64  dword2    sequence number (ADD, REMOVE, ACK, QUERY, VERDICT, QP_RENEW(ED))
//                       HELLO: u16 the sender port's LID (0 on RoCE), then zeros
//   48   16B  gid       HELLO: the sender's GID (RoCE v2; InfiniBand: the port GID)
// CHALLENGE and PROOF use the frame as bytes: 8..40 the 32-byte MAC (mac_a, mac_c:
// handshake.h), 48..64 CHALLENGE's server nonce; everything else 0.
// A HELLO is followed by `name bytes` of node name (0 in the accepting side's reply)
// and `qp count` QpInfo records of kQpInfoBytes {u32 qpn, u32 psn}. A WINDOW_ADD is
// followed by `extent count` records of kWindowRecordBytes {u64 offset, u64 bytes,
// u32 rkey, u32 zero}: one registration per extent, addressed as iova base + its
// offset in the region (the iova base is the region's address within its page: the
// kernel wants iova and address to agree there), so no address of the target's leaves
// it. Unused fields must be zero.
//
// Sequence: the connecting side (the source) sends HELLO; the accepting side (the
// target) answers CHALLENGE if it holds a fabric key for the name in HELLO, and
// closes the connection otherwise; the source checks mac_a and answers PROOF; only
// once mac_c checks does the target create as many QPs, move them to RTR/RTS and
// answer HELLO (or REFUSE), then a WINDOW_ADD for every window open for that peer,
// then READY. A source that does not prove itself within kHandshakeTimeoutMs is
// closed, and gets neither QPs nor windows. Afterwards:
//   target -> source  WINDOW_ADD (OpenWindow waits for its ACK), WINDOW_REMOVE (not
//                     waited for), VERDICT (answers a QUERY), QP_RENEWED (answers a
//                     QP_RENEW);
//   source -> target  ACK (of every ADD and REMOVE, by sequence number), QUERY (a write
//                     the source cannot map to a registration: the target says why it
//                     refuses it), QP_RENEW (re-connect QP `index` of the link after a
//                     refusal put it into error).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/handshake.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric::verbs::wire {

inline constexpr uint32_t kMagic = 0x42564C46;  // "FLVB"
// 2: windows instead of region tables, QUERY/VERDICT, QP_RENEW(ED).
// 3: CHALLENGE and PROOF (authenticated control connections).
// 4: HELLO carries the port's LID (InfiniBand addressing).
// REFUSE's word1 (why) came later without a new version: a peer older than it reads a
// REFUSE that says why as malformed, and its handshake fails all the same.
inline constexpr uint16_t kVersion = 4;
inline constexpr size_t kFrameBytes = 64;
inline constexpr size_t kQpInfoBytes = 8;
inline constexpr size_t kGidBytes = 16;
inline constexpr size_t kWindowRecordBytes = 24;
// QPs one HELLO may carry: bounds what a peer can make us create.
inline constexpr uint32_t kMaxQpsPerHello = 64;
// Node names as the TCP fabric's HELLO bounds them.
inline constexpr size_t kMaxNameBytes = fabric::wire::kMaxNodeNameBytes;

static_assert(48 + kGidBytes == kFrameBytes, "the layout above fills the frame");
static_assert(8 + handshake::kMacBytes == 40, "a MAC fills words 0..3, dwords 0..1");
static_assert(handshake::kNonceBytes == kGidBytes, "a server nonce fills the gid");
static_assert(handshake::kNonceBytes == 16, "a client nonce fills dwords 0..1");
static_assert(kWindowRecordBytes == 8 + 8 + 4 + 4, "offset, bytes, rkey, padding");
// The largest WINDOW_ADD a source reads: bounds what a target can make it buffer.
inline constexpr size_t kMaxWindowAddBytes =
    kFrameBytes + kMaxWindowExtents * kWindowRecordBytes;

enum class FrameType : uint16_t {
  kHello = 1,
  kRefuse = 2,
  kWindowAdd = 3,
  kWindowRemove = 4,
  kReady = 5,
  kAck = 6,
  kQuery = 7,
  kVerdict = 8,
  kQpRenew = 9,
  kQpRenewed = 10,
  kChallenge = 11,
  kProof = 12,
};

struct QpInfo {
  uint32_t qpn = 0;
  uint32_t psn = 0;  // 24 bits
};

struct Hello {
  uint32_t nic = 0;
  uint32_t mtu = 0;  // ibv_mtu
  uint16_t lid = 0;  // InfiniBand: the port's LID; 0 on RoCE
  std::array<uint8_t, kGidBytes> gid{};
  std::string name;                 // empty in the reply
  std::vector<QpInfo> qps;          // 1..kMaxQpsPerHello
  handshake::Nonce client_nonce{};  // zero in the reply
};
struct HelloHeader {  // a decoded HELLO frame, before its name and QP records
  uint32_t nic = 0;
  uint32_t qp_count = 0;
  uint32_t mtu = 0;
  uint32_t name_bytes = 0;
  uint16_t lid = 0;
  std::array<uint8_t, kGidBytes> gid{};
  handshake::Nonce client_nonce{};
};
// The target's answer to HELLO, before any QP exists for the source.
struct Challenge {
  handshake::Nonce server_nonce{};
  handshake::Mac mac{};  // mac_a
};
// The source's answer to CHALLENGE.
struct Proof {
  handshake::Mac mac{};  // mac_c
};
struct Refuse {
  absl::StatusCode code = absl::StatusCode::kUnknown;
  // Why, where a REFUSE can say it (word1; 0: not said, as before it could).
  std::optional<fabric::wire::ConnectionRefusal> why;
};
// One extent of a window and its registration on the link's NIC.
struct WindowRecord {
  uint64_t offset = 0;  // in the region; also the registration's iova
  uint64_t bytes = 0;
  uint32_t rkey = 0;
};
struct WindowAdd {  // a decoded WINDOW_ADD frame, before its records
  WindowKey key = 0;
  uint32_t extent_count = 0;  // 1..kMaxWindowExtents
  uint64_t iova_base = 0;     // the remote address of the region's byte 0
  uint64_t seq = 0;
};
struct WindowRemove {
  WindowKey key = 0;
  uint64_t seq = 0;
};
struct Ready {};
struct Ack {
  uint64_t seq = 0;
};
// A write the source could not post: may it land, and if not, why not?
struct Query {
  WindowKey key = 0;
  uint32_t bytes = 0;
  uint64_t offset = 0;
  uint64_t seq = 0;
};
struct Verdict {
  Refusal refusal = Refusal::kNone;  // kNone: the target would admit it
  uint64_t seq = 0;
};
// QP `index` of the link again, with a new PSN (QP_RENEW: the source's same QPN;
// QP_RENEWED: the target's new QP).
struct QpRenew {
  uint32_t index = 0;
  uint32_t qpn = 0;
  uint32_t psn = 0;  // 24 bits
  uint64_t seq = 0;
};
struct QpRenewed {
  uint32_t index = 0;
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint64_t seq = 0;
};

using Frame = std::array<uint8_t, kFrameBytes>;
using Decoded = std::variant<HelloHeader, Refuse, WindowAdd, WindowRemove, Ready, Ack,
                             Query, Verdict, QpRenew, QpRenewed, Challenge, Proof>;

// The whole HELLO: frame, name, QP records. INVALID_ARGUMENT for a bad name or count.
absl::StatusOr<std::string> EncodeHello(const Hello& hello);
Frame EncodeRefuse(const Refuse& refuse);
Frame EncodeChallenge(const Challenge& challenge);
Frame EncodeProof(const Proof& proof);
// The whole WINDOW_ADD: frame and records. INVALID_ARGUMENT for 0 or more than
// kMaxWindowExtents records, or key 0.
absl::StatusOr<std::string> EncodeWindowAdd(WindowKey key, uint64_t iova_base,
                                            uint64_t seq,
                                            std::span<const WindowRecord> records);
Frame EncodeWindowRemove(const WindowRemove& remove);
Frame EncodeReady();
Frame EncodeAck(const Ack& ack);
Frame EncodeQuery(const Query& query);
Frame EncodeVerdict(const Verdict& verdict);
Frame EncodeQpRenew(const QpRenew& renew);
Frame EncodeQpRenewed(const QpRenewed& renewed);

// Validates magic, version, type, unused fields zero, and bounds (QP count in
// 1..kMaxQpsPerHello, name bytes <= kMaxNameBytes, MTU a valid ibv_mtu, REFUSE code
// a known non-OK code and its refusal 0 or a known ConnectionRefusal, window key
// non-zero, extent count 1..kMaxWindowExtents, refusal
// <= kMaxRefusal, PSN 24 bits). INVALID_ARGUMENT otherwise.
absl::StatusOr<Decoded> DecodeFrame(std::span<const uint8_t, kFrameBytes> bytes);
// The QP records that follow a HELLO.
std::vector<QpInfo> DecodeQpInfos(std::span<const uint8_t> bytes);
// The records that follow a WINDOW_ADD (a multiple of kWindowRecordBytes). The extents
// are checked where they are used (RemoteWindow); here only the padding, zero.
absl::StatusOr<std::vector<WindowRecord>> DecodeWindowRecords(
    std::span<const uint8_t> bytes);

}  // namespace fuselink::fabric::verbs::wire
