// Transfers within one node, as a fabric: the node is a peer of its own (kSelf), and
// a write to it is a copy by the node's own engines (memcpy, or the GPUs' copy
// engines: peer to peer over NVLink, or across PCIe to and from host memory) instead
// of a send on a NIC. Everything above the fabric stays as it is for an in-node move:
// the landing opens its windows (here), the engine's window writes chunks into them,
// the landing counts what landed and gives the verdict, which comes back as a notice.
//
// InNodeFabric wraps the node's fabric and forwards everything that is not the node's
// own. It mirrors every region registered through it (under the wrapped fabric's key)
// so that its copies can find their memory, and holds the windows the node opens for
// itself. The placement rule is the wrapped fabric's: a copy lands only inside an open
// window of the node's own, and a closed window drains before it is reported closed.
//
// One lane (NIC 0 in completions and arrivals) served by `workers` threads, each with
// its own GPU copier; a worker takes up to kBatch queued writes at once and waits for
// their GPU copies together. A window key is unique across both fabrics' open windows.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/stats.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/region_table.h"
#include "agent/fabric/window_table.h"

namespace fuselink::fabric {

// Where a copy reads or writes: host memory (gpu -1), or a device address on `gpu`.
struct Place {
  uint8_t* base = nullptr;
  int gpu = -1;
};

// Moves bytes that touch GPU memory for one worker thread: a batch of copies is
// started, then waited for together.
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  // Starts copying `bytes` from `from` to `to`.
  virtual absl::Status Start(const Place& to, const Place& from, uint64_t bytes) = 0;
  // Returns once every copy started since the last Wait is done; the first error.
  // Bounded (gpu/copy_bound.h): DEADLINE_EXCEEDED, reason GPU_COPY_TIMEOUT, once the
  // node's bound passes; the copier is then spent (it refuses every later copy) and the
  // lane makes a new one.
  virtual absl::Status Wait() = 0;
  // Keeps `memory` (a region a timed-out copy may still read or write) while copies of
  // this copier may still touch it, past the copier's own life if need be.
  virtual void KeepWhileBusy(std::shared_ptr<const void> memory) = 0;
};
// Makes one copier per worker; empty on nodes without GPUs.
using DeviceCopierFactory =
    std::function<absl::StatusOr<std::unique_ptr<DeviceCopier>>()>;

struct InNodeOptions {
  std::string node;  // this node's name: the peer name of its own windows
  int workers = 2;
  // Data writes queued at once; past it PostWrite is RESOURCE_EXHAUSTED. Notices are
  // always taken.
  size_t queue_depth = 256;
  DeviceCopierFactory copier;
};

// Copies of the in-node lane, for the metrics.
struct InNodeCounters {
  uint64_t host_bytes = 0;    // host memory to host memory
  uint64_t device_bytes = 0;  // any copy that reads or writes GPU memory
  uint64_t refused_writes = 0;
  uint64_t failed_copies = 0;
};

class InNodeFabric final : public Fabric {
 public:
  // The node's own peer id. The wrapped fabric numbers its peers from 1 upwards.
  static constexpr PeerId kSelf = 0xffffffffu;

  // `handler` receives the in-node lane's completions and arrivals (the same one the
  // wrapped fabric was made with).
  InNodeFabric(std::unique_ptr<Fabric> wrapped, Handler* handler, InNodeOptions options);
  // Stops the workers; writes still queued complete UNAVAILABLE. Then the wrapped
  // fabric goes.
  ~InNodeFabric() override;

  absl::string_view transport() const override { return wrapped_->transport(); }
  int nic_count() const override { return wrapped_->nic_count(); }
  std::vector<Endpoint> endpoints() const override { return wrapped_->endpoints(); }
  absl::StatusOr<RegionKey> RegisterRegion(
      void* base, uint64_t bytes, std::shared_ptr<const void> keepalive) override;
  absl::StatusOr<RegionKey> RegisterDeviceRegion(
      uint64_t address, uint64_t bytes, int gpu,
      std::shared_ptr<const void> keepalive) override;
  std::string GpuPath(int gpu, int nic) const override {
    return wrapped_->GpuPath(gpu, nic);
  }
  absl::Status DeregisterRegion(RegionKey key) override;
  absl::StatusOr<WindowKey> OpenWindow(RegionKey region, absl::string_view peer_name,
                                       std::span<const Extent> extents) override;
  void CloseWindow(WindowKey window, absl::AnyInvocable<void() &&> drained) override;
  // The node's own windows never wait; a peer's are the wrapped fabric's.
  bool OpenWindowMayWait() const override { return wrapped_->OpenWindowMayWait(); }
  absl::StatusOr<PeerId> Connect(absl::string_view peer_name,
                                 const std::vector<Endpoint>& remote) override;
  void Disconnect(PeerId peer) override;
  void CancelConnects() override { wrapped_->CancelConnects(); }
  std::string PeerName(PeerId peer) const override;
  std::optional<PeerId> FindPeer(absl::string_view name) const override;
  absl::Status PostWrite(PeerId peer, int nic, const WriteOp& op) override;
  NicCounters counters(int nic) const override { return wrapped_->counters(nic); }

  InNodeCounters in_node_counters() const;

  // In-node bytes by copy, failed copies, refused writes (the wrapped fabric's
  // per-NIC counters are ReportFabricStats').
  void ReportStats(stats::Sink& sink) const;

 private:
  struct Queued {
    WriteOp op;
    std::shared_ptr<const Region> source;  // null for a notice
  };
  // Writes a worker takes at once; their GPU copies share one wait.
  static constexpr size_t kBatch = 16;
  // Records the wrapped fabric's region `key` for the lane's copies; returns `key`.
  RegionKey Mirror(RegionKey key, uint8_t* base, uint64_t bytes, int gpu,
                   std::shared_ptr<const void> keepalive);
  void Work(std::unique_ptr<DeviceCopier> copier);
  // One write of a batch being landed.
  struct Pending {
    const Queued* write;
    Completion done;
    WindowTable::Placement placement;  // held until the arrival is told
    bool placed = false;
  };
  // Places the batch's writes and tells the handler of each; how its GPU copies ended.
  absl::Status LandBatch(std::vector<Queued>& batch, DeviceCopier* copier);
  // Tells the handler of `l`, given how the batch's GPU copies ended (`copied`).
  void Finish(Pending& l, const absl::Status& copied, DeviceCopier* copier);
  // Copies host to host at once; starts a GPU copy on `copier` and sets `*device`.
  absl::Status Start(const Region& to, uint64_t to_offset, const Region& from,
                     uint64_t from_offset, uint32_t bytes, DeviceCopier* copier,
                     bool* device);

  std::unique_ptr<Fabric> wrapped_;  // reset last in the destructor's body
  Handler* const handler_;
  const InNodeOptions options_;

  mutable absl::Mutex regions_mu_;
  absl::flat_hash_map<RegionKey, std::shared_ptr<const Region>> regions_
      ABSL_GUARDED_BY(regions_mu_);

  // Keys of the wrapped fabric's open windows, so that no own key repeats one.
  absl::Mutex keys_mu_;
  absl::flat_hash_set<WindowKey> wrapped_windows_ ABSL_GUARDED_BY(keys_mu_);
  absl::flat_hash_set<WindowKey> own_windows_ ABSL_GUARDED_BY(keys_mu_);
  WindowTable windows_;

  absl::Mutex queue_mu_;
  absl::CondVar queue_cv_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(queue_mu_);
  size_t queued_data_ ABSL_GUARDED_BY(queue_mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(queue_mu_) = false;

  std::atomic<uint64_t> host_bytes_{0}, device_bytes_{0}, refused_{0}, failed_{0};
  std::vector<std::thread> workers_;
};

}  // namespace fuselink::fabric
