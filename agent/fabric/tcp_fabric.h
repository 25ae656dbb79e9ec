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
// Both sides must use the same max_write_bytes: a WRITE larger than the target's is
// malformed there.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/fabric_keys.h"
#include "agent/fabric/handshake.h"

namespace fuselink::fabric {

// Bounds on the options, checked by CreateTcpFabric.
inline constexpr int kMaxConnectionsPerNic = 16;
inline constexpr int kMaxQueueDepthPerNic = 1 << 16;
// Connections (accepted and opened) one fabric holds at once.
inline constexpr size_t kMaxConnections = 4096;
static_assert(handshake::kMaxUnprovenConnections < kMaxConnections);
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
};

// INVALID_ARGUMENT for options out of bounds or without keys; the bind/listen failure
// otherwise. `handler` must outlive the fabric.
absl::StatusOr<std::unique_ptr<Fabric>> CreateTcpFabric(const TcpFabricOptions& options,
                                                        Handler* handler);

}  // namespace fuselink::fabric
