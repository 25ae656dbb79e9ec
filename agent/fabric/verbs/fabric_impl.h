// The verbs fabric's class, shared by its four files: verbs/fabric.cc (options, NICs,
// GPU paths, start and teardown), verbs/fabric_links.cc (peers and their control
// links), verbs/fabric_writes.cc (posted and staged writes) and
// verbs/fabric_windows.cc (regions and windows). Internal to fuselink_fabric_verbs;
// callers use verbs/fabric.h.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/fabric/acceptor.h"
#include "agent/fabric/peer_table.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/verbs/fabric.h"
#include "agent/fabric/verbs/host_shadow.h"
#include "agent/fabric/verbs/link.h"
#include "agent/fabric/verbs/nic.h"
#include "agent/fabric/verbs/staged_sender.h"
#include "agent/fabric/verbs/staging.h"
#include "agent/fabric/verbs/worker.h"
#include "agent/fabric/window_table.h"

namespace fuselink::fabric::verbs_internal {

using verbs::ControlLink;
using verbs::Nic;
using verbs::VerbsQp;
using LinkPtr = std::shared_ptr<ControlLink>;

// A registered region: its memory and one MR per NIC, local access only (the lkeys of
// writes that read from it). Destroyed (MRs deregistered) when the table, every open
// window on it and every write reading from it have let go.
struct VerbsRegion {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  // Where byte 0 is in the iova space of its windows' registrations: its offset in its
  // page (the kernel wants iova and address to agree there), so the peer learns
  // nothing of the address.
  uint64_t iova_base = 0;
  std::shared_ptr<const void> keepalive;
  int gpu = -1;  // host memory
  // GPU memory on a dma-buf NIC: the export its registrations (and windows') use.
  std::optional<DmabufRange> dmabuf;
  // [nic]; null for GPU memory a NIC reaches only through staging.
  std::vector<verbs::MemoryRegion> mrs;
};

// An open window's registrations: on every NIC, each extent on its own, in the peer's
// protection domain. Members die bottom-up: registrations, then the domain, then the
// memory they lie in (the shadow, the region).
struct VerbsWindow {
  struct OnNic {
    std::shared_ptr<verbs::PeerDomain> domain;
    std::vector<verbs::MemoryRegion> mrs;  // [extent]
  };
  std::string peer;
  std::vector<Extent> extents;
  std::shared_ptr<const VerbsRegion> region;
  // Where staged NICs place the bytes of a window into GPU memory; null otherwise.
  std::shared_ptr<const HostShadow> shadow;
  std::vector<OnNic> nics;  // [nic]

  // What WINDOW_ADD carries for NIC `nic`.
  verbs::WindowPush Push(WindowKey key, int nic) const;
};

class VerbsFabric final : public Fabric, public verbs::NicHost, public verbs::LinkHost {
 public:
  VerbsFabric(const VerbsFabricOptions& options, Handler& handler,
              std::vector<SocketAddress> local, std::vector<Endpoint> endpoints);
  ~VerbsFabric() override;

  // Opens NIC i; called for every NIC before Start.
  absl::Status OpenNic(int index, verbs::NicBinding binding);
  // Probes every (GPU, NIC) pair and prints the paths; after OpenNic, before Start.
  absl::Status ChooseGpuPaths();
  absl::Status Start(std::vector<UniqueFd> listeners);

  // Fabric.
  absl::string_view transport() const override { return "verbs"; }
  int nic_count() const override { return static_cast<int>(endpoints_.size()); }
  std::vector<Endpoint> endpoints() const override { return endpoints_; }
  absl::StatusOr<RegionKey> RegisterRegion(
      void* base, uint64_t bytes, std::shared_ptr<const void> keepalive) override;
  absl::StatusOr<RegionKey> RegisterDeviceRegion(
      uint64_t address, uint64_t bytes, int gpu,
      std::shared_ptr<const void> keepalive) override;
  std::string GpuPath(int gpu, int nic) const override;
  absl::Status DeregisterRegion(RegionKey key) override;
  absl::StatusOr<WindowKey> OpenWindow(RegionKey region, absl::string_view peer_name,
                                       std::span<const Extent> extents) override;
  void CloseWindow(WindowKey window, absl::AnyInvocable<void() &&> drained) override;
  bool OpenWindowMayWait() const override { return true; }  // registrations, the ACK
  absl::StatusOr<PeerId> Connect(absl::string_view peer_name,
                                 const std::vector<Endpoint>& remote) override;
  void Disconnect(PeerId peer) override;
  void CancelConnects() override { pending_.CancelAll(); }
  std::string PeerName(PeerId peer) const override;
  std::optional<PeerId> FindPeer(absl::string_view name) const override {
    absl::ReaderMutexLock lock(&mu_);
    return peers_.Find(name);
  }
  absl::Status PostWrite(PeerId peer, int nic, const WriteOp& op) override;
  NicCounters counters(int nic) const override;

  // NicHost and LinkHost.
  Handler& handler() override { return handler_; }
  DeviceStager* device_stager() override { return options_.device_stager; }
  std::variant<WindowTable::Placement, Refusal> Admit(WindowKey key,
                                                      absl::string_view peer,
                                                      uint64_t offset,
                                                      uint64_t bytes) const override {
    return window_table_.Admit(key, peer, offset, bytes);
  }
  void OnQpCreated(uint64_t link) override;
  void OnQpClosed(uint64_t link, VerbsQp* qp, const absl::Status& why) override;
  void OnQpRefused(uint64_t link, std::shared_ptr<VerbsQp> qp) override;

  // LinkHost.
  absl::string_view node_name() const override { return options_.node_name; }
  const FabricKeys& keys() const override { return *options_.keys; }
  int stall_timeout_ms() const override { return options_.stall_timeout_ms; }
  absl::Status AdmitInbound(uint64_t link, absl::string_view name) override;
  absl::StatusOr<PeerId> AttachInbound(uint64_t link, absl::string_view name) override;
  std::vector<verbs::WindowPush> StartPushing(uint64_t link) override;
  Refusal Judge(WindowKey key, absl::string_view peer, uint64_t offset,
                uint64_t bytes) override;
  void RunOnWorker(absl::AnyInvocable<void() &&> task) override {
    worker_.Run(std::move(task));
  }
  void OnLinkFinished(uint64_t link) override;

 private:
  using Peer = PeerTable<LinkPtr>::Peer;
  struct LinkEntry {
    LinkPtr link;
    PeerId peer = 0;
    int live_qps = 0;
    bool finished = false;  // its thread is done, or it will never have one
    bool pushing = false;   // inbound: receives WINDOW_ADDs of its peer
    bool reaping = false;
    // Writes handed to its NIC's sender thread and not yet posted or failed.
    int deferred = 0;
    // Holds its peer up: QPs left to drain, a thread still running (which may
    // complete queried writes, or renew QPs), or deferred writes.
    bool alive() const { return live_qps > 0 || !finished || deferred > 0; }
  };
  // Staged writes out of GPU memory, and writes behind a fence, of one NIC.
  // Only with a device stager. `pool`, `stage` and `unusable` belong to the sender's
  // thread; a pool slot is taken only under a claim of the sender's and when one is
  // free, so that BouncePool::Acquire never waits there.
  struct NicSender {
    explicit NicSender(const VerbsFabricOptions& options);
    std::shared_ptr<verbs::BouncePool> pool;  // made with the stage on first use
    std::unique_ptr<DeviceStage> stage;
    absl::Status unusable;       // why they could not be made
    std::atomic<int> queued{0};  // bounded by queue_depth_per_nic
    verbs::StagedSender queues;  // a queue per peer, and each peer's share of slots
  };
  // A deferred write on its way, as far as it got: the fence passed, a slot claimed,
  // the source staged, the first spent quota seen. Tried on its NIC's sender thread.
  struct Deferred final : verbs::StagedSender::Write {
    verbs::StagedSender::Step Try() override { return fabric->TryDeferred(*this); }
    void Abandon(const absl::Status& why) override { fabric->EndDeferred(*this, why); }

    VerbsFabric* fabric = nullptr;
    uint64_t link = 0;
    PeerId peer = 0;
    int nic = 0;
    WriteOp op;
    std::shared_ptr<const VerbsRegion> region;           // null for a notification
    bool fenced = false;                                 // op.after waited for
    std::shared_ptr<const void> claim;                   // on a bounce slot, until staged
    std::optional<verbs::WriteSource> source;            // staged, or the region's own
    absl::Time quota_deadline = absl::InfiniteFuture();  // set by a spent quota
  };

  LinkPtr NewLink(int nic, ControlLink::Role role, UniqueFd fd)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PeerId LivePeer(absl::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AttachLocked(LinkEntry& entry, PeerId peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeReap(uint64_t id, LinkEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK, or RESOURCE_EXHAUSTED (reason FABRIC_PEER_CONNECTIONS, counted on the NIC of
  // `link`) when the live peer `name` holds max_links_per_peer_ open inbound links.
  absl::Status CheckPeerShare(const ControlLink& link, absl::string_view name)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The peer's name once none of its links holds it up any more (then it is
  // forgotten), else nothing.
  std::optional<std::string> LoseIfDone(PeerId peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // PostWrite's half after the source is known: the QP, the target's registration.
  absl::Status PostResolved(PeerId peer, int nic, const WriteOp& op,
                            verbs::WriteSource source);
  // Where a write out of `region` (null: a notification) reads on `nic`, which
  // reaches it.
  static verbs::WriteSource DirectSource(const std::shared_ptr<const VerbsRegion>& region,
                                         int nic, uint64_t offset);
  // Hands a staged or fenced write to its NIC's sender thread.
  absl::Status Defer(PeerId peer, int nic, const WriteOp& op,
                     std::shared_ptr<const VerbsRegion> region);
  // On the sender thread: waits for the fence, claims a slot and stages, posts; or
  // completes it failed. kNoSlot without a slot for its peer, kRetry while the QP's
  // quota is spent (for at most kQuotaWait).
  verbs::StagedSender::Step TryDeferred(Deferred& write);
  // A slot of its peer's share for a staged write, or how it waits for one.
  std::optional<verbs::StagedSender::Step> ClaimSlot(Deferred& write);
  absl::Status PassFence(Deferred& write);
  // Into the slot `write` claimed, where the NIC cannot read its region.
  absl::StatusOr<verbs::WriteSource> StageSource(Deferred& write);
  // Completes `write` failed unless `status` is OK (posted), then FinishDeferred.
  void EndDeferred(Deferred& write, absl::Status status);
  void FinishDeferred(const Deferred& write);
  void OnAccepted(int nic, UniqueFd socket);
  void Reap();
  bool ReaperHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return reaper_stop_ || !finished_.empty();
  }
  bool NoLinks() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return links_.empty(); }
  // On the closer thread, once no arrival through the window is being delivered:
  // deregisters its registrations, runs `drained`, tells the peer.
  void FinishClose(WindowKey key, absl::AnyInvocable<void() &&> drained);
  // A key for `region`, its MRs made; RESOURCE_EXHAUSTED past kMaxRegions.
  absl::StatusOr<RegionKey> AddRegion(std::shared_ptr<VerbsRegion> region);
  // The host shadow of a window into GPU memory that some NIC reaches only by
  // staging; none otherwise.
  absl::Status MakeShadow(VerbsWindow& window);
  // Extent `i` of `window` on NIC `nic`, in the window's peer domain there.
  absl::StatusOr<verbs::MemoryRegion> RegisterExtent(const VerbsWindow& window, int nic,
                                                     size_t i);
  // Releases `count` window registrations of every NIC.
  void ReleaseRegistrations(size_t count);
  // The first teardown failure that had nobody to go to, kept (and printed once).
  void KeepTeardownError(const absl::Status& status);

  const VerbsFabricOptions options_;
  Handler& handler_;
  const std::vector<SocketAddress> local_;
  const std::vector<Endpoint> endpoints_;
  // Accepted control links one peer may hold open (VerbsFabricOptions).
  const size_t max_links_per_peer_;
  // Declared first so that it dies last: regions' MRs and links' QPs live on its PDs.
  std::vector<std::unique_ptr<Nic>> nics_;
  // Window registrations each NIC holds (all NICs hold the same number).
  std::atomic<uint64_t> window_registrations_{0};
  // [gpu][nic], fixed before Start.
  std::vector<std::vector<verbs::GpuPath>> gpu_paths_;
  std::atomic<uint64_t> shadow_bytes_{0};  // of open windows' host shadows

  mutable absl::Mutex regions_mu_;  // taken after mu_ where both are held
  std::unordered_map<RegionKey, std::shared_ptr<const VerbsRegion>> regions_
      ABSL_GUARDED_BY(regions_mu_);
  RegionKey next_region_key_ ABSL_GUARDED_BY(regions_mu_) = 1;
  // The software half of every window: who may write where, arrivals being delivered.
  WindowTable window_table_;

  ConnectLocks connect_locks_;  // taken before mu_
  PendingSockets pending_;      // the control sockets of the Connects under way
  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool reaper_stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_link_id_ ABSL_GUARDED_BY(mu_) = 1;
  // A peer is lost when none of its links is alive().
  PeerTable<LinkPtr> peers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, LinkEntry> links_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> finished_ ABSL_GUARDED_BY(mu_);
  // The registrations of every open window, by key (the same keys as window_table_).
  std::unordered_map<WindowKey, std::shared_ptr<VerbsWindow>> open_windows_
      ABSL_GUARDED_BY(mu_);

  absl::Mutex teardown_error_mu_;
  absl::Status teardown_error_ ABSL_GUARDED_BY(teardown_error_mu_);

  std::thread reaper_;
  std::unique_ptr<Acceptor> acceptor_;
  // Stopped explicitly in the destructor. Two, so that a slow deregistration (rxe took
  // 1 s for a window with writes in flight) never holds up a QP renewal or a QUERY.
  verbs::Worker closer_{"fl-verbs-close"};  // window closes
  verbs::Worker worker_{"fl-verbs-work"};   // QP renewals, QUERY sends
  // [nic], made with the NICs when there is a device stager; else empty.
  std::vector<std::unique_ptr<NicSender>> senders_;
};

}  // namespace fuselink::fabric::verbs_internal
