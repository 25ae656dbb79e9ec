// The target side of transfers: incoming slots reserved by PrepareIncoming, filled
// by the fabric's arrivals, and the watchers that learn when blocks are ready.
// Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/fabric/fabric.h"
#include "agent/memory/registry.h"
#include "agent/topo/topology.h"
#include "agent/transfer/imm.h"
#include "fuselink/v1/agent.pb.h"
#include "fuselink/v1/peer.pb.h"

namespace fuselink::transfer {

// A slot that sees no arrival for this long is failed and freed: its source is
// gone without a word.
inline constexpr absl::Duration kIncomingIdleTimeout = absl::Seconds(30);

// Receives the end of every incoming transfer. Called with no lock held, on the
// fabric's threads or the caller of Expire.
using WatchFn = std::function<void(const v1::WatchEvent& event)>;
// Receives this node's idle-NIC mask whenever it changes, with no lock held.
using CreditFn = std::function<void(uint32_t idle_mask)>;

// Bytes that landed through one NIC: for its owner GPU's tensors, or for others'
// (data that a source sent over a NIC it borrowed).
struct LandingNicStats {
  uint64_t own_bytes = 0;
  uint64_t borrowed_bytes = 0;
  bool owner_busy = false;
};

class Landing {
 public:
  // `nic_count`: this node's NICs (rails).
  Landing(memory::Registry* registry, int nic_count, WatchFn on_event,
          CreditFn on_credit);

  // Checks the target side of a transfer and reserves a slot for it.
  absl::StatusOr<v1::PrepareIncomingResponse> Prepare(
      const v1::PrepareIncomingRequest& request);

  void OnArrival(const fabric::Arrival& arrival);
  // Fails every slot whose source is `peer_name`.
  void OnPeerLost(absl::string_view peer_name, const absl::Status& why);
  // Fails the incoming transfers into tensor `tensor_id` (TensorLease::id) with `why`.
  void AbortTensor(uint64_t tensor_id, const absl::Status& why);
  // Fails slots idle longer than kIncomingIdleTimeout.
  void Expire(absl::Time now);

  // Writes that named no live slot (stale generation, unknown slot, wrong region).
  uint64_t stray_writes() const { return stray_writes_.load(); }
  size_t active() const;
  // Bit k set when no incoming transfer has rail k as its source's direct NIC: no
  // owner traffic arrives on NIC k, and sources may borrow it. (With rails, GPU s on
  // the source reaches any GPU here through NIC s; that is the NIC it loads.)
  uint32_t IdleMask() const;
  // Nodes with incoming transfers here: the ones to tell of credit changes.
  std::vector<std::string> ActiveSources() const;
  LandingNicStats Stats(int nic) const;

 private:
  struct Slot {
    uint32_t generation = 0;
    bool active = false;
    std::string source_node;
    std::string transfer_id;
    memory::TensorLease tensor;
    std::vector<uint32_t> block_ids;
    uint32_t layer_begin = 0, layer_end = 0;
    int rail = 0;  // the source's direct NIC: its own traffic arrives on this rail
    uint64_t expected_bytes = 0;
    uint64_t landed_bytes = 0;
    absl::Time last_activity;
  };
  // Frees the slot and returns the watch event describing its end.
  v1::WatchEvent CloseLocked(Slot& slot, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t IdleMaskLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls on_credit_ if the mask moved since it was last told.
  void TellCredit();

  memory::Registry* const registry_;
  const int nic_count_;
  const WatchFn on_event_;
  const CreditFn on_credit_;
  std::atomic<uint64_t> stray_writes_{0};
  struct alignas(64) NicBytes {
    std::atomic<uint64_t> own{0}, borrowed{0};
  };
  std::array<NicBytes, topo::kMaxNics> nic_bytes_;
  std::atomic<uint32_t> told_mask_{UINT32_MAX};

  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);  // kMaxIncoming, fixed
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);
  std::array<uint32_t, topo::kMaxNics> owner_slots_ ABSL_GUARDED_BY(mu_) = {};  // per NIC
};

}  // namespace fuselink::transfer
