// Test doubles for the source engine's parts: a fabric that records every write and
// lets the test complete them in any order — or drop, repeat, refuse, or fail them,
// or answer a full queue — a peer link with scripted answers, a relay pool whose
// fences remember the thread that waited, and host tensors in sealed memfds.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/fabric/fabric.h"
#include "agent/memory/registry.h"
#include "agent/relay/pool.h"
#include "agent/transfer/peer_link.h"
#include "fuselink/v1/agent.pb.h"

namespace fuselink::transfer::testing {

// Long enough for a loaded machine; waits end as soon as their condition holds.
inline constexpr absl::Duration kWaitTimeout = absl::Seconds(20);

struct Posted {
  fabric::PeerId peer = 0;
  int nic = 0;
  fabric::WriteOp op;
};

class FakeFabric final : public fabric::Fabric {
 public:
  explicit FakeFabric(int nic_count) : nic_count_(nic_count) {}

  // Where completions go (the engine's OnCompletion, or a job's).
  void set_on_completion(std::function<void(const fabric::Completion&)> f) {
    on_completion_ = std::move(f);
  }
  // The next `count` posts on `nic` (-1: every NIC) answer `status` (count -1: all).
  void FailPosts(int nic, absl::Status status, int count = -1);
  void ClearPostFailures();

  // Writes posted and not yet taken, oldest first.
  std::vector<Posted> pending() const;
  size_t pending_count() const;
  // Takes the writes posted so far (the test then completes, drops or repeats them).
  std::vector<Posted> Take();
  // Every write ever posted (kept), and every post answered with an error.
  std::vector<Posted> history() const;
  size_t posts() const;
  size_t refused_posts() const;
  // Waits until at least `count` writes are pending.
  bool WaitForPending(size_t count, absl::Duration timeout = kWaitTimeout);

  // Completes `write` with `status`; a refusal gives its own status.
  void Complete(const Posted& write, absl::Status status = absl::OkStatus());
  void Refuse(const Posted& write, fabric::Refusal refusal);
  // Completes every pending write OK, and those posted meanwhile, until none is
  // pending or `max_rounds` passed. Returns how many it completed.
  size_t CompleteAll(int max_rounds = 1000);
  // Completes every pending write UNAVAILABLE: what a fabric's flush does.
  size_t FlushAll();

  // fabric::Fabric
  absl::string_view transport() const override { return "fake"; }
  int nic_count() const override { return nic_count_; }
  std::vector<fabric::Endpoint> endpoints() const override { return {}; }
  absl::StatusOr<fabric::RegionKey> RegisterRegion(
      void* base, uint64_t bytes, std::shared_ptr<const void> keepalive) override;
  absl::StatusOr<fabric::RegionKey> RegisterDeviceRegion(
      uint64_t address, uint64_t bytes, int gpu,
      std::shared_ptr<const void> keepalive) override;
  absl::Status DeregisterRegion(fabric::RegionKey key) override;
  absl::StatusOr<fabric::WindowKey> OpenWindow(
      fabric::RegionKey region, absl::string_view peer_name,
      std::span<const fabric::Extent> extents) override;
  void CloseWindow(fabric::WindowKey window,
                   absl::AnyInvocable<void() &&> drained) override;
  bool OpenWindowMayWait() const override { return false; }
  absl::StatusOr<fabric::PeerId> Connect(
      absl::string_view peer_name, const std::vector<fabric::Endpoint>& remote) override;
  // Records the peer; its writes stay pending (the test flushes them, as the real
  // fabric's closed connections do on their own threads).
  void Disconnect(fabric::PeerId peer) override;
  std::vector<fabric::PeerId> disconnects() const;
  void CancelConnects() override {}
  std::string PeerName(fabric::PeerId peer) const override { return ""; }
  std::optional<fabric::PeerId> FindPeer(absl::string_view name) const override {
    return std::nullopt;
  }
  absl::Status PostWrite(fabric::PeerId peer, int nic,
                         const fabric::WriteOp& op) override;
  fabric::NicCounters counters(int nic) const override { return {}; }

 private:
  struct Failure {
    int nic;
    absl::Status status;
    int count;
  };
  const int nic_count_;
  std::function<void(const fabric::Completion&)> on_completion_;
  mutable absl::Mutex mu_;
  std::vector<Posted> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<Posted> history_ ABSL_GUARDED_BY(mu_);
  std::vector<Failure> failures_ ABSL_GUARDED_BY(mu_);
  size_t posts_ ABSL_GUARDED_BY(mu_) = 0;
  size_t refused_posts_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<fabric::PeerId> disconnects_ ABSL_GUARDED_BY(mu_);
  uint32_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
};

// A target that answers PrepareIncoming and QueryVerdict as scripted. It knows
// node-b and the nodes added; every node's answers are the same.
class FakePeerLink final : public PeerLink {
 public:
  FakePeerLink();

  // Knows `node` too.
  void AddNode(const std::string& node);

  bool Knows(absl::string_view node) const override;
  absl::StatusOr<Prepared> PrepareIncoming(const IncomingSpec& spec) override;
  absl::StatusOr<std::optional<absl::Status>> QueryVerdict(absl::string_view target_node,
                                                           absl::string_view transfer_id,
                                                           absl::Time deadline) override;

  // The answer to every PrepareIncoming: `prepared`, or an error. The n-th call
  // (from 0) gets slot index `prepared.slot`'s + n.
  void set_prepared(absl::StatusOr<Prepared> prepared);
  // PrepareIncoming blocks until Release: for every target, or for `target` alone.
  void Block();
  void Release();
  void Block(const std::string& target);
  void Release(const std::string& target);
  // Answers to QueryVerdict, in order; past them, NOT_FOUND.
  void AddReply(absl::StatusOr<std::optional<absl::Status>> reply);

  std::vector<IncomingSpec> specs() const;
  int queries() const;
  int prepares_returned() const;
  bool WaitForPrepares(int count, absl::Duration timeout = kWaitTimeout) const;
  // Waits until `count` PrepareIncoming calls for `target` began.
  bool WaitForPreparesOf(const std::string& target, int count,
                         absl::Duration timeout = kWaitTimeout) const;
  // PrepareIncoming calls for `target` that began.
  int prepares_of(const std::string& target) const;
  bool WaitForQueries(int count, absl::Duration timeout = kWaitTimeout) const;

 private:
  mutable absl::Mutex mu_;
  absl::StatusOr<Prepared> prepared_ ABSL_GUARDED_BY(mu_);
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> blocked_targets_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> nodes_ ABSL_GUARDED_BY(mu_) = {"node-b"};
  std::vector<IncomingSpec> specs_ ABSL_GUARDED_BY(mu_);
  struct Reply {
    absl::Status error;                   // not OK: the call failed
    std::optional<absl::Status> verdict;  // else: nullopt while open
  };
  std::deque<Reply> replies_ ABSL_GUARDED_BY(mu_);
  int queries_ ABSL_GUARDED_BY(mu_) = 0;
  int prepares_returned_ ABSL_GUARDED_BY(mu_) = 0;
};

// A GPU relay's stand-in: `slots` per NIC to begin with, Grow adds one up to `cap`;
// each slot's fence records the threads that waited on it.
class FakeRelayPool final : public relay::Pool {
 public:
  FakeRelayPool(int nics, uint32_t slots, uint32_t cap);
  ~FakeRelayPool() override;

  relay::Slot Acquire(int nic) override { return TryAcquire(nic); }
  relay::Slot TryAcquire(int nic) override;
  bool Grow(int nic) override;
  void Release(const relay::Slot& slot) override;
  absl::Status Stage(const relay::Slot& slot, relay::Source source,
                     uint32_t bytes) override;
  uint64_t held_bytes() const override { return 0; }

  // At most `cap` slots per NIC (no more than the cap it was made with).
  void SetCap(uint32_t cap);
  int in_use() const;
  int staged() const;
  int grown() const;
  // Threads that waited on a fence, and how many waits.
  std::vector<std::thread::id> fence_waiters() const;
  bool WaitForReleases(int in_use, absl::Duration timeout = kWaitTimeout) const;

 private:
  struct FakeFence final : fabric::Fence {
    explicit FakeFence(FakeRelayPool* pool) : pool(pool) {}
    absl::Status Wait() override;
    FakeRelayPool* pool;
  };
  const uint32_t max_cap_;
  mutable absl::Mutex mu_;
  uint32_t cap_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<uint32_t>> free_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> made_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<FakeFence>> fences_ ABSL_GUARDED_BY(mu_);
  int in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int staged_ ABSL_GUARDED_BY(mu_) = 0;
  int grown_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread::id> waiters_ ABSL_GUARDED_BY(mu_);
};

// A host tensor in a sealed memfd, registered as `name` with `layout` (home GPU
// `home_gpu`).
absl::StatusOr<memory::TensorInfo> RegisterHostTensor(memory::Registry& registry,
                                                      const std::string& name,
                                                      const memory::Layout& layout,
                                                      uint32_t home_gpu = 0);
// A "GPU" tensor at a made-up device address on `gpu` (nothing reads it here).
absl::StatusOr<memory::TensorInfo> RegisterGpuTensor(memory::Registry& registry,
                                                     const std::string& name,
                                                     const memory::Layout& layout,
                                                     int gpu);

// A request from node-a's `source` blocks to node-b's `target` blocks, all layers.
v1::TransferRequest MakeRequest(const std::string& request_id, const std::string& source,
                                std::vector<uint32_t> source_blocks,
                                const std::string& target,
                                std::vector<uint32_t> target_blocks);

// What node-b answers PrepareIncoming with: window 77, slot {5, 300}, `layout`.
Prepared MakePrepared(const memory::Layout& layout, uint32_t idle_mask = 0);

}  // namespace fuselink::transfer::testing
