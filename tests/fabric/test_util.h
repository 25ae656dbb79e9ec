// Helpers shared by the fabric tests: a recording Handler, fabric keys agreed as the
// peer bootstrap would, loopback options, raw sockets that play a misbehaving peer.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/fabric_keys.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/tcp/fabric.h"

namespace fuselink::fabric::testing {

// Long enough for a loaded machine; waits end as soon as their condition holds.
inline constexpr absl::Duration kWaitTimeout = absl::Seconds(20);

// Records every event; thread-safe, never blocks for long.
class RecordingHandler : public Handler {
 public:
  void OnCompletion(const Completion& completion) override;
  void OnArrival(const Arrival& arrival) override;
  void OnPeerLost(PeerId peer, absl::string_view name, const absl::Status& why) override;

  // Each waits up to kWaitTimeout until at least `count` events are recorded.
  bool WaitForCompletions(size_t count);
  bool WaitForArrivals(size_t count);
  bool WaitForPeersLost(size_t count);

  std::vector<Completion> completions() const;
  std::vector<Arrival> arrivals() const;
  std::vector<std::pair<PeerId, absl::Status>> peers_lost() const;
  std::vector<std::string> peer_lost_names() const;

 private:
  bool WaitFor(const size_t* size, size_t count);

  mutable absl::Mutex mu_;
  std::vector<Completion> completions_ ABSL_GUARDED_BY(mu_);
  std::vector<Arrival> arrivals_ ABSL_GUARDED_BY(mu_);
  // Owns what each recorded arrival's peer_name views; a deque never moves them.
  std::deque<std::string> arrival_names_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<PeerId, absl::Status>> peers_lost_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> peer_lost_names_ ABSL_GUARDED_BY(mu_);
  size_t completion_count_ ABSL_GUARDED_BY(mu_) = 0;
  size_t arrival_count_ ABSL_GUARDED_BY(mu_) = 0;
  size_t peers_lost_count_ ABSL_GUARDED_BY(mu_) = 0;
};

// What the peer bootstrap does for two nodes: each makes an accept key for the other
// and hands it over as the other's connect key.
void AgreeKeys(FabricKeys& a, absl::string_view a_name, FabricKeys& b,
               absl::string_view b_name);

// The keys of every node of a test, each pair agreed: For(name) makes a node's keys
// and agrees them with every node made before. Must outlive the fabrics using them.
class KeyRing {
 public:
  FabricKeys* For(absl::string_view name);

 private:
  absl::Mutex mu_;
  absl::node_hash_map<std::string, FabricKeys> nodes_ ABSL_GUARDED_BY(mu_);
};

// Buffers a fixture declares before its fabrics, so that the fabrics' threads are
// joined before the memory goes. A write completes when the target acknowledges
// it, and ASan checks a sendmsg's buffer only after the call returns: a buffer
// local to the test body may be checked after the test ended and freed it.
class Buffers {
 public:
  std::vector<uint8_t>& Keep(std::vector<uint8_t> bytes) {
    return kept_.emplace_back(std::move(bytes));
  }

 private:
  std::deque<std::vector<uint8_t>> kept_;
};

// A DeviceStager whose "device memory" is host memory: a copy happens at the stage's
// Wait, as a GPU copy is done only once waited for (so a caller that does not wait
// sees stale bytes); records which GPUs were named, checks that no stage buffer is
// refilled before the copy that used it was waited for, and fails the copy numbered
// `fail_copy` (from 1) when set, at its start (or hangs `hang_copy`).
class HostStager final : public DeviceStager {
 public:
  static constexpr uint32_t kPiece = 4096;
  struct Log {
    std::atomic<uint64_t> to_host_bytes{0};
    std::atomic<uint64_t> to_device_bytes{0};
    std::atomic<int> last_target_gpu{-1};
    std::atomic<int> last_source_gpu{-1};
    std::atomic<int> buffer_reused_early{0};
    std::atomic<uint64_t> pinned_bytes{0};  // allocated and not yet freed
    std::atomic<int> copies{0};
    std::atomic<int> fail_copy{0};
    // The copy numbered `hang_copy` (from 1) never ends: the Wait after it answers as
    // a copy past its bound does, and the stage is spent. What stages were asked to
    // keep for it is counted in `kept` (and held for the stage's life).
    std::atomic<int> hang_copy{0};
    std::atomic<int> kept{0};
  };

  absl::StatusOr<std::unique_ptr<DeviceStage>> NewStage(int nic) override;
  absl::StatusOr<std::shared_ptr<uint8_t>> AllocatePinned(int nic,
                                                          uint64_t bytes) override;
  Log& log() { return log_; }

 private:
  Log log_;
};

// Many bytes quickly (splitmix64), where mt19937 per byte is slow (under TCG).
std::vector<uint8_t> ManyBytes(size_t bytes, uint64_t seed);

// A fence that answers `result` and counts its waits; `done`, when set, runs at the
// wait (the device work the fence stood for, e.g. writing the source).
class CountingFence final : public Fence {
 public:
  explicit CountingFence(absl::Status result, std::function<void()> done = nullptr)
      : result_(std::move(result)), done_(std::move(done)) {}
  absl::Status Wait() override {
    ++waits;
    if (done_) done_();
    return result_;
  }
  std::atomic<int> waits{0};

 private:
  const absl::Status result_;
  const std::function<void()> done_;
};

// Options for a fabric of `nic_count` NICs on 127.0.0.<first_host>, <first_host + 1>,
// ..., ports picked by the kernel, with the keys `ring` holds for `name`.
TcpFabricOptions LoopbackOptions(std::string name, int first_host, KeyRing& ring,
                                 int nic_count = 2);
std::string LoopbackAddress(int host);

// A raw TCP connection from 127.0.0.<from_host> to `to`.
absl::StatusOr<UniqueFd> RawConnect(int from_host, const Endpoint& to);
// A raw connection from 127.0.0.9 to `target`'s NIC `nic` that has proved itself as
// node "raw" to node "target", with the key `keys` agreed for them.
absl::StatusOr<UniqueFd> AuthenticatedRaw(KeyRing& keys, const Fabric& target,
                                          int nic = 0);
absl::Status SendRaw(int fd, const void* data, size_t bytes);
// True when the peer closes the connection (EOF or reset) within kWaitTimeout.
bool WaitUntilClosed(int fd);

// A listener at `address` (a free port) that never accepts, with a kernel backlog of
// `backlog`: with room in it, connects complete and nobody reads their HELLO; with
// it full (backlog 0 and one connection queued), the kernel drops their SYNs.
absl::StatusOr<UniqueFd> DeafListener(const std::string& address, int backlog,
                                      Endpoint* endpoint);
// Connects `fabric` to "hole" at `hole` on every NIC, on a thread: the connect must
// hang, and CancelConnects must end it with CANCELLED well before its 10 s timeouts
// would, and refuse the next one. Needs a key for "hole" (KeyRing::For).
void ExpectCancelEndsTheConnect(Fabric& fabric, const Endpoint& hole);

// Listens like a fabric's NICs and authenticates what connects, as `name` with
// `keys`, then never reads or answers again: a peer that hangs.
class SilentPeer {
 public:
  static absl::StatusOr<std::unique_ptr<SilentPeer>> Create(int first_host, int nic_count,
                                                            std::string name,
                                                            const FabricKeys* keys);
  ~SilentPeer();
  const std::vector<Endpoint>& endpoints() const { return endpoints_; }
  // Waits for `count` authenticated connections and resets them all, as a crash
  // would.
  absl::Status ResetAll(int count);

 private:
  SilentPeer(std::string name, const FabricKeys* keys)
      : name_(std::move(name)), keys_(keys) {}
  void Serve();

  const std::string name_;
  const FabricKeys* const keys_;
  std::vector<UniqueFd> listeners_;
  std::vector<Endpoint> endpoints_;
  absl::Mutex mu_;
  std::vector<UniqueFd> held_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace fuselink::fabric::testing
