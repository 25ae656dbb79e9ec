// The limits that several parts share, each defined once here, with the relations
// between them checked at compile time: budgets that span parts are sums and bounds
// here, not prose. A part's own limits stay in its own header.
#pragma once

#include <cstdint>

namespace fuselink {

// NICs one node drives. The topology refuses more; the scheduler, the landing, the
// engine and the foreign-traffic watch keep per-NIC state in arrays of this size, and
// hand NIC sets around as 32-bit masks.
inline constexpr int kMaxNics = 16;
// GPUs one node drives (the topology refuses more).
inline constexpr int kMaxGpus = 16;
// NIC indices the fabric's wire format can name (a HELLO's NIC field, a fabric's NIC
// set): room beyond kMaxNics, so that the format outlives the node's bound.
inline constexpr uint32_t kMaxWireNics = 64;

// The longest timeout or bound on a wait any option may set, in milliseconds (an
// hour): the fabric's stall and ACK timeouts, the drain bound, a landing's idle
// timeout, a GPU copy's bound.
inline constexpr int kMaxTimeoutMs = 3'600'000;

// Chunks one transfer keeps in flight, at most (--window_chunks): the engine's window,
// the landing's ranges, a wr_id's window entry (transfer/wr_id.h).
inline constexpr uint32_t kMaxWindowChunks = 1024;
// Writes one NIC keeps in flight over all its peers, at most: the TCP fabric's and the
// verbs fabric's queue_depth_per_nic (its CQE quota).
inline constexpr int kMaxTcpQueueDepthPerNic = 1 << 16;
inline constexpr int kMaxVerbsQueueDepthPerNic = 1 << 16;
// Writes in flight on one verbs QP, at most (wr_depth_per_qp): a ring slot in the
// verbs wr_id (fabric/verbs/nic.h).
inline constexpr uint32_t kMaxWrDepth = 1 << 14;

static_assert(kMaxNics < 32, "NIC masks are 32-bit");
static_assert(static_cast<uint32_t>(kMaxNics) <= kMaxWireNics,
              "every NIC a node drives must be nameable on the wire");
// A transfer's window may all go to one NIC (the scheduler places chunks where it
// likes), so the largest window fits one NIC's send queue on either transport, and
// one QP's ring (a peer session on verbs may have a single QP per NIC).
static_assert(kMaxWindowChunks <= static_cast<uint32_t>(kMaxTcpQueueDepthPerNic),
              "a whole window fits one NIC's TCP queue");
static_assert(kMaxWindowChunks <= static_cast<uint32_t>(kMaxVerbsQueueDepthPerNic),
              "a whole window fits one NIC's verbs queue");
static_assert(kMaxWindowChunks <= kMaxWrDepth, "a whole window fits one QP's ring");

}  // namespace fuselink
