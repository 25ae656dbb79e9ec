// The proof a new fabric connection gives before it may write, as pure functions:
// nonces and HMAC-SHA256 (OpenSSL libcrypto), no sockets. Both transports frame it
// (wire.h for TCP, verbs/wire.h for the verbs control link); the exchange is the same:
//
//   connector C -> acceptor A   HELLO     {nic, C's name, client_nonce}
//   A -> C                      CHALLENGE {server_nonce, mac_a}
//   C -> A                      PROOF     {mac_c}
//
// with K = A's accept key for C = C's connect key for A (fabric_keys.h) and
//   mac_a = HMAC(K, kAcceptorLabel  | transcript)
//   mac_c = HMAC(K, kConnectorLabel | transcript)
//   transcript = u32 len | C | u32 len | A | u32 nic | client_nonce | server_nonce
// (integers little-endian; the lengths make the names unambiguous). A closes the
// connection unless it knows C and mac_c checks; C gives up unless mac_a checks, so
// neither side talks to an impostor. The server nonce is fresh on every connection,
// so a PROOF recorded from one cannot answer another's CHALLENGE.
//
// What it does not do: frames after the PROOF are not signed. It keeps out anyone
// who reaches a fabric port without the key, not an attacker on the path who can
// take over an established TCP connection.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/common/errors.h"
#include "agent/fabric/fabric_keys.h"

namespace fuselink::fabric::handshake {

// Accepted connections of one fabric that have not proved themselves yet (each gets
// the hello timeout). Past it, the oldest of them is closed for the new one: a
// stranger holding many half-open connections costs a real peer at most a retry,
// and never fills the fabric's connection table.
inline constexpr size_t kMaxUnprovenConnections = 64;

inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kMacBytes = 32;  // SHA-256
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// Domain separation: a MAC one side makes is never valid as the other's.
inline constexpr absl::string_view kAcceptorLabel = "fuselink fabric acceptor v3";
inline constexpr absl::string_view kConnectorLabel = "fuselink fabric connector v3";
// The reason a failed proof carries (WithReason).
inline constexpr Reason kAuthReason = reasons::kFabricAuth;
// Names the MAC input may hold: node names are bounded by the wire (255 bytes).
inline constexpr size_t kMaxNameBytes = 255;

enum class Side { kAcceptor, kConnector };

// What both MACs of one connection bind. The views must outlive the call.
struct Transcript {
  absl::string_view connector;
  absl::string_view acceptor;
  uint32_t nic = 0;
  Nonce client_nonce{};
  Nonce server_nonce{};
};

// 16 bytes from getrandom(2).
absl::StatusOr<Nonce> NewNonce();

// The key an acceptor proves itself with to `connector`, the name its HELLO gave.
// UNAUTHENTICATED with reason FABRIC_AUTH when this node holds none for it.
absl::StatusOr<SessionKey> AcceptorKeyFor(const FabricKeys& keys,
                                          absl::string_view connector);

// `side`'s MAC over `transcript` under `key`. INVALID_ARGUMENT for an empty name or
// one over kMaxNameBytes; INTERNAL if libcrypto fails.
absl::StatusOr<Mac> ComputeMac(const SessionKey& key, Side side,
                               const Transcript& transcript);

// OK when `mac` is `side`'s MAC over `transcript` under `key`, compared in constant
// time. UNAVAILABLE with reason FABRIC_AUTH otherwise (the peer holds another key,
// perhaps a stale one: retry after the bootstrap has run again).
absl::Status VerifyMac(const SessionKey& key, Side side, const Transcript& transcript,
                       const Mac& mac);

}  // namespace fuselink::fabric::handshake
