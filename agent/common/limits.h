// The limits that several parts share, each defined once here, with the relations
// between them checked at compile time. A part's own limits stay in its own header.
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

static_assert(kMaxNics < 32, "NIC masks are 32-bit");
static_assert(static_cast<uint32_t>(kMaxNics) <= kMaxWireNics,
              "every NIC a node drives must be nameable on the wire");

}  // namespace fuselink
