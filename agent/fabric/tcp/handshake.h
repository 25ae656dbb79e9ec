// The TCP fabric's connection handshake (handshake.h) on a socket: HELLO, CHALLENGE,
// PROOF as wire.h frames them. Blocking; each side bounds the whole exchange by a
// deadline, so a peer that stalls mid-way holds a thread for at most timeout_ms.
#pragma once

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/common/errors.h"
#include "agent/fabric/fabric_keys.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric {

// The reason a handshake failure carries when the peer sent a frame that does not
// decode (wire::DecodeHeader), as opposed to one that decodes but proves nothing.
inline constexpr Reason kMalformedReason = reasons::kFabricMalformed;
// An accepted connection refused past its peer's share (max_connections_per_peer).
inline constexpr Reason kPeerConnectionsReason = reasons::kFabricPeerConnections;

// Connector side, on a connected socket to `acceptor`'s NIC `nic`: says HELLO as
// `self`, checks the CHALLENGE's mac_a against `key` (our connect key for `acceptor`)
// and answers PROOF. The socket's receive timeout is 0 again on success.
// UNAVAILABLE with reason FABRIC_AUTH when the acceptor does not prove the key;
// RESOURCE_EXHAUSTED with reason FABRIC_PEER_CONNECTIONS when it refuses us (REFUSE):
// `self` holds its share of connections there; UNAVAILABLE when it closes (it holds
// no key for `self`) or answers garbage; DEADLINE_EXCEEDED after timeout_ms.
absl::Status ProveToAcceptor(int fd, uint32_t nic, absl::string_view self,
                             absl::string_view acceptor, const SessionKey& key,
                             int timeout_ms);

// Acceptor side, on a socket accepted on NIC `nic` of the node `self`: reads HELLO,
// answers CHALLENGE with a fresh nonce under keys.FindAcceptKey(connector), checks the
// PROOF. Returns the connector's name, now proven; the receive timeout is 0 again.
// Fails (and the caller closes) on a malformed frame (reason FABRIC_MALFORMED), a
// HELLO for another NIC, a connector it holds no key for, a wrong PROOF (reason
// FABRIC_AUTH), or no PROOF within timeout_ms. `admit`, given the name a HELLO
// gives (one we hold a key for), may refuse it before the CHALLENGE: its error is
// returned, after a REFUSE where RefuseConnector can say it.
absl::StatusOr<std::string> AuthenticateConnector(
    int fd, uint32_t nic, absl::string_view self, const FabricKeys& keys,
    uint32_t max_write_bytes, int timeout_ms,
    absl::FunctionRef<absl::Status(absl::string_view connector)> admit =
        [](absl::string_view) { return absl::OkStatus(); });

// The status a REFUSE from the acceptor stands for: RESOURCE_EXHAUSTED with reason
// FABRIC_PEER_CONNECTIONS.
absl::Status RefusedByAcceptor(wire::ConnectionRefusal why);

// Acceptor side, refusing the connection on `fd` for `why`: when `why` is one a
// REFUSE can say (reason FABRIC_PEER_CONNECTIONS), sends it, best effort (40 bytes into
// a send buffer the handshake left empty: it does not block). The caller closes
// either way. Returns `why`.
absl::Status RefuseConnector(int fd, absl::Status why);

}  // namespace fuselink::fabric
