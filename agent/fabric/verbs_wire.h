// The verbs fabric's control channel, as bytes. Pure: no sockets, no verbs calls.
//
// RC QPs need QPN, PSN, GID and MTU from the far side before they can move to RTR, and
// a source needs the target's (address, rkey) for every region it writes into. Both
// travel on one small TCP connection per (peer, NIC) — the NIC's Endpoint, as for the
// TCP fabric — never on the data path. All data goes over the RC QPs.
//
// Every frame is kFrameBytes, little-endian:
//   off size  field
//    0   u32  magic     kMagic
//    4   u16  version   kVersion
//    6   u16  type      FrameType
//    8   u32  word0     HELLO: nic        REGION_ADD/REMOVE: key   REFUSE: status code
//   12   u32  word1     HELLO: qp count   REGION_ADD: rkey
//   16   u32  word2     HELLO: mtu (ibv_mtu enum)
//   20   u32  word3     HELLO: name bytes
//   24   u64  dword0    REGION_ADD: remote address
//   32   u64  dword1    REGION_ADD: bytes
//   40   u64  dword2    REGION_ADD/REMOVE/ACK: sequence number
//   48   16B  gid       HELLO: the sender's RoCE v2 GID
// A HELLO is followed by `name bytes` of node name (0 in the accepting side's reply)
// and `qp count` QpInfo records of kQpInfoBytes {u32 qpn, u32 psn}. Unused fields must
// be zero.
//
// Sequence: the connecting side sends HELLO; the accepting side creates as many QPs,
// moves them to RTR/RTS and answers HELLO (or REFUSE), then its region table as
// REGION_ADDs, then READY. Afterwards the accepting side (the target) pushes
// REGION_ADD / REGION_REMOVE as it registers and deregisters; the connecting side (the
// source) answers every frame carrying a sequence number with ACK.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric::verbs::wire {

inline constexpr uint32_t kMagic = 0x42564C46;  // "FLVB"
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kFrameBytes = 64;
inline constexpr size_t kQpInfoBytes = 8;
inline constexpr size_t kGidBytes = 16;
// QPs one HELLO may carry: bounds what a peer can make us create.
inline constexpr uint32_t kMaxQpsPerHello = 64;
// Node names as the TCP fabric's HELLO bounds them.
inline constexpr size_t kMaxNameBytes = fabric::wire::kMaxNodeNameBytes;

static_assert(48 + kGidBytes == kFrameBytes, "the layout above fills the frame");

enum class FrameType : uint16_t {
  kHello = 1,
  kRefuse = 2,
  kRegionAdd = 3,
  kRegionRemove = 4,
  kReady = 5,
  kAck = 6,
};

struct QpInfo {
  uint32_t qpn = 0;
  uint32_t psn = 0;  // 24 bits
};

struct Hello {
  uint32_t nic = 0;
  uint32_t mtu = 0;  // ibv_mtu
  std::array<uint8_t, kGidBytes> gid{};
  std::string name;         // empty in the reply
  std::vector<QpInfo> qps;  // 1..kMaxQpsPerHello
};
struct HelloHeader {  // a decoded HELLO frame, before its name and QP records
  uint32_t nic = 0;
  uint32_t qp_count = 0;
  uint32_t mtu = 0;
  uint32_t name_bytes = 0;
  std::array<uint8_t, kGidBytes> gid{};
};
struct Refuse {
  absl::StatusCode code = absl::StatusCode::kUnknown;
};
struct RegionAdd {
  RegionKey key = 0;
  uint32_t rkey = 0;
  uint64_t address = 0;
  uint64_t bytes = 0;
  uint64_t seq = 0;
};
struct RegionRemove {
  RegionKey key = 0;
  uint64_t seq = 0;
};
struct Ready {};
struct Ack {
  uint64_t seq = 0;
};

using Frame = std::array<uint8_t, kFrameBytes>;
using Decoded = std::variant<HelloHeader, Refuse, RegionAdd, RegionRemove, Ready, Ack>;

// The whole HELLO: frame, name, QP records. INVALID_ARGUMENT for a bad name or count.
absl::StatusOr<std::string> EncodeHello(const Hello& hello);
Frame EncodeRefuse(const Refuse& refuse);
Frame EncodeRegionAdd(const RegionAdd& add);
Frame EncodeRegionRemove(const RegionRemove& remove);
Frame EncodeReady();
Frame EncodeAck(const Ack& ack);

// Validates magic, version, type, unused fields zero, and bounds (QP count in
// 1..kMaxQpsPerHello, name bytes <= kMaxNameBytes, MTU a valid ibv_mtu, REFUSE code
// a known non-OK code, region key non-zero). INVALID_ARGUMENT otherwise.
absl::StatusOr<Decoded> DecodeFrame(std::span<const uint8_t, kFrameBytes> bytes);
// The QP records that follow a HELLO.
std::vector<QpInfo> DecodeQpInfos(std::span<const uint8_t> bytes);

}  // namespace fuselink::fabric::verbs::wire
