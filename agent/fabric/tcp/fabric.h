// The Fabric over plain TCP sockets: one listener per NIC, `connections_per_nic`
// connections per NIC and peer, each write sent as a WRITE frame (wire.h) and
// acknowledged by the target once its bytes are placed.
//
// Peers: one table keyed by the name a peer gives (Connect's peer_name, or the name
// in an accepted HELLO). So a node that both connects to "b" and is connected to by
// "b" sees one PeerId for "b", carrying arrivals from it and taking writes to it.
// A PeerId lives while the peer has a connection open; when its last connection is
// gone (or Disconnect retires it) OnPeerLost fires once and the id is never reused;
// a later Connect or HELLO under the same name gets a fresh id.
//
// OnPeerLost's status: CANCELLED when this side closed deliberately (Disconnect,
// destruction), UNAVAILABLE otherwise. The destructor closes every connection, so
// every still-known peer gets its OnPeerLost and every write in flight its
// UNAVAILABLE completion before the destructor returns; the Handler must outlive
// the fabric.
//
// Authentication: every connection proves, before it carries a write, that its
// connector holds the key the acceptor made for it (fabric_keys.h, handshake.h).
// Connect fails FAILED_PRECONDITION (reason FABRIC_NO_KEY) without a connect key for
// the peer, UNAVAILABLE (reason FABRIC_AUTH) when the peer does not prove it; an
// accepted connection that does not prove itself is closed and counted
// (NicCounters::auth_failures).
//
// Nothing waits forever (the bounds are options, each counted in NicCounters when it
// fires): an accepted connection may idle between frames, but once a frame has begun
// its bytes must keep coming (stall_timeout_ms; DEADLINE_EXCEEDED, reason
// FABRIC_STALL, the connection closes and the write it was placing lets its window
// drain); writes of ours on the wire must see an ACK every ack_timeout_ms
// (DEADLINE_EXCEEDED, reason FABRIC_ACK_TIMEOUT: the connection closes and its writes
// complete UNAVAILABLE, to go again on other connections); and one authenticated
// peer holds at most max_connections_per_peer of our accepted connections (reason
// FABRIC_PEER_CONNECTIONS: closed before its CHALLENGE, so the connector's Connect
// fails UNAVAILABLE, or right after its PROOF when another took the last place first).
//
// Both sides must use the same max_write_bytes: a WRITE larger than the target's is
// malformed there.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/limits.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/fabric_keys.h"
#include "agent/fabric/handshake.h"

namespace fuselink::fabric {

// Bounds on the options, checked by CreateTcpFabric (with kMaxTcpQueueDepthPerNic and
// kMaxTimeoutMs, agent/common/limits.h).
inline constexpr int kMaxConnectionsPerNic = 16;
// Connections (accepted and opened) one fabric holds at once.
inline constexpr size_t kMaxConnections = 4096;
static_assert(handshake::kMaxUnprovenConnections < kMaxConnections);
// One peer session's connections, both ways on every NIC a node drives, fit the
// connection table with room for every other peer's handshakes.
static_assert(2 * kMaxConnectionsPerNic * kMaxNics + handshake::kMaxUnprovenConnections <=
              kMaxConnections);
// How long Connect waits for one TCP handshake.
inline constexpr int kConnectTimeoutMs = 10'000;

struct TcpFabricOptions {
  // Introduces this node in HELLO; 1..255 printable ASCII characters.
  std::string node_name;
  // NIC i listens on nics[i] (nics[i].nic must be i); port 0 lets the kernel pick,
  // endpoints() reports the real one. Outbound connections of NIC i bind to its
  // address as well.
  std::vector<Endpoint> nics;
  int connections_per_nic = 2;
  // The largest write, in both directions.
  uint32_t max_write_bytes = 64 << 20;
  // Writes posted on one NIC and not yet completed, over all its peers.
  int queue_depth_per_nic = 512;
  // Copies GPU regions' bytes through pinned host memory; without it GPU regions
  // cannot be registered. Must outlive the fabric.
  DeviceStager* device_stager = nullptr;
  // Required: the keys this node proves and checks. Must outlive the fabric.
  FabricKeys* keys = nullptr;
  // Accepted connections: once a frame (header or payload) has begun, the longest its
  // peer may send no byte of it, and the longest an ACK may wait for room to be sent.
  // Judged every quarter of it: the connection closes between 1x and 1.25x this
  // after the last byte. 1..kMaxTimeoutMs.
  int stall_timeout_ms = 10'000;
  // Our connections: while writes are on the wire, the longest without an ACK (judged
  // every eighth of it). Past it the connection closes and its writes fail
  // UNAVAILABLE, reason kept. 1..kMaxTimeoutMs.
  int ack_timeout_ms = 10'000;
  // Accepted connections one authenticated peer may hold at once; 0 sizes it from
  // what a peer configured like this node opens (DefaultConnectionsPerPeer).
  // 0..kMaxConnections.
  int max_connections_per_peer = 0;
};

// Twice what a peer with our connections_per_nic opens over our NICs (Connect opens
// connections_per_nic on each NIC; the NIC count is the same on both sides): room
// for a peer configured with more connections per NIC than we are.
int DefaultConnectionsPerPeer(const TcpFabricOptions& options);

// INVALID_ARGUMENT for options out of bounds or without keys; the bind/listen failure
// otherwise. `handler` must outlive the fabric.
absl::StatusOr<std::unique_ptr<Fabric>> CreateTcpFabric(const TcpFabricOptions& options,
                                                        Handler* handler);

}  // namespace fuselink::fabric
