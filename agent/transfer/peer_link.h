// What the transfer engine needs from the peers: whether a node is known, and a
// target's acceptance of an incoming transfer. Implemented over gRPC by agent/peer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/fabric/fabric.h"
#include "agent/memory/layout.h"
#include "agent/memory/memory_extent.h"

namespace fuselink::transfer {

struct IncomingSpec {
  std::string target_node;
  std::string transfer_id;
  std::string tensor;
  std::vector<uint32_t> block_ids;
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;
  uint64_t block_bytes = 0;
  uint64_t total_bytes = 0;
  int source_nic = 0;  // the transfer's direct NIC
  // The most bytes of the transfer in flight at once (window_chunks x chunk_bytes).
  uint64_t in_flight_bytes = 0;
  // Who asked for the transfer (Requester::identity); the target checks it against
  // the target tensor's writers.
  std::string requester;
  absl::Time deadline = absl::InfiniteFuture();
  // The source tensor's name and memory (alive while its job holds it): a target on
  // this node must not share that memory (an in-node move would overwrite what it
  // reads).
  std::string source_tensor;
  const std::vector<memory::MemoryExtent>* source_memory = nullptr;
};

// The target's answer: where to write, and the slot to name in every immediate.
struct Prepared {
  fabric::PeerId peer = 0;
  // The windows the target opened for this transfer alone, by target region (0 for a
  // region it does not write): exactly its target blocks.
  std::vector<fabric::WindowKey> windows;
  memory::Layout layout;
  uint32_t slot = 0;
  uint32_t idle_nic_mask = 0;  // the target's idle NICs when it accepted
  // The target agent's incarnation (PrepareIncomingResponse.incarnation): verdict
  // notices are matched only to transfers of the target's latest one.
  uint64_t incarnation = 0;
};

class PeerLink {
 public:
  // Told once how a Bootstrap ended.
  using BootstrapDone = absl::AnyInvocable<void(absl::Status) &&>;

  virtual ~PeerLink() = default;
  virtual bool Knows(absl::string_view node) const = 0;
  // Whether the session with `node` is up, so that PrepareIncoming starts with no
  // bootstrap (a Hello and the fabric's connects, which a target that does not answer
  // makes last seconds). Never blocks. A link without sessions is always up.
  virtual bool SessionUp(absl::string_view node) const { return true; }
  // Brings the session with `node` up off the caller's thread, then calls `done` once
  // with how it went (from a thread of the link's own, or at once when it cannot
  // start: unknown node, shutting down). Never blocks. A bootstrap already under way
  // for `node` is joined, not repeated.
  virtual void Bootstrap(absl::string_view node, absl::Time deadline,
                         BootstrapDone done) {
    std::move(done)(absl::OkStatus());
  }
  // Connects to the target if needed, then asks it to accept. Blocks up to the
  // spec's deadline. The target's own errors come back with their codes; the
  // deadline passing is DEADLINE_EXCEEDED (reason DEADLINE); an unreachable target
  // is UNAVAILABLE (reason PEER_UNREACHABLE).
  virtual absl::StatusOr<Prepared> PrepareIncoming(const IncomingSpec& spec) = 0;
  // Asks the target over the control channel how it ended `transfer_id`, for when no
  // verdict notice came on the fabric: nullopt while the target still holds the
  // transfer open; else its verdict (OK: every byte landed), with the target's code,
  // reason and message. NOT_FOUND (UNKNOWN_TRANSFER) when the target has no record of
  // it; UNAVAILABLE (PEER_UNREACHABLE) when it cannot be reached. Blocks up to
  // `deadline`.
  virtual absl::StatusOr<std::optional<absl::Status>> QueryVerdict(
      absl::string_view target_node, absl::string_view transfer_id,
      absl::Time deadline) = 0;
};

}  // namespace fuselink::transfer
