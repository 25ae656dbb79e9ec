// The TCP fabric's class, shared by its three files: tcp/fabric.cc (creation, start,
// teardown, the reaper), tcp/fabric_peers.cc (connects, accepts, peers and their
// shares) and tcp/fabric_writes.cc (posting writes, the NICs' counters). Internal
// to fuselink_fabric_tcp; callers use tcp/fabric.h.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/fabric/acceptor.h"
#include "agent/fabric/checks.h"
#include "agent/fabric/peer_table.h"
#include "agent/fabric/region_table.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/tcp/connection.h"
#include "agent/fabric/tcp/fabric.h"
#include "agent/fabric/window_table.h"

namespace fuselink::fabric::tcp_internal {

using ConnectionPtr = std::shared_ptr<TcpConnection>;

class TcpFabric final : public Fabric, public ConnectionHost {
 public:
  // `local` holds NIC i's address with port 0, for binding outbound sockets.
  TcpFabric(const TcpFabricOptions& options, Handler& handler,
            std::vector<SocketAddress> local, std::vector<Endpoint> endpoints)
      : options_(options),
        handler_(handler),
        local_(std::move(local)),
        endpoints_(std::move(endpoints)),
        stats_(options.nics.size()),
        max_connections_per_peer_(options.max_connections_per_peer > 0
                                      ? options.max_connections_per_peer
                                      : DefaultConnectionsPerPeer(options)) {}
  ~TcpFabric() override;

  absl::Status Start(std::vector<UniqueFd> listeners);

  // Fabric.
  absl::string_view transport() const override { return "tcp"; }
  int nic_count() const override { return static_cast<int>(endpoints_.size()); }
  std::vector<Endpoint> endpoints() const override { return endpoints_; }
  absl::StatusOr<RegionKey> RegisterRegion(
      void* base, uint64_t bytes, std::shared_ptr<const void> keepalive) override {
    return regions_.Register(base, bytes, std::move(keepalive));
  }
  // Every NIC reaches host memory only: GPU bytes cross through the stager's buffers.
  std::string GpuPath(int gpu, int nic) const override {
    return options_.device_stager != nullptr ? "staged" : "none";
  }
  absl::StatusOr<RegionKey> RegisterDeviceRegion(
      uint64_t address, uint64_t bytes, int gpu,
      std::shared_ptr<const void> keepalive) override {
    if (options_.device_stager == nullptr) {
      return absl::FailedPreconditionError(
          "this agent has no GPU runtime: it cannot stage GPU memory");
    }
    if (gpu < 0) return absl::InvalidArgumentError("a GPU region needs a GPU");
    return regions_.Register(reinterpret_cast<void*>(address), bytes,
                             std::move(keepalive), gpu);
  }
  absl::Status DeregisterRegion(RegionKey key) override {
    return regions_.Deregister(key);
  }
  absl::StatusOr<WindowKey> OpenWindow(RegionKey region, absl::string_view peer_name,
                                       std::span<const Extent> extents) override {
    FL_ASSIGN_OR_RETURN(std::shared_ptr<const Region> r, regions_.Find(region, 0, 0));
    return windows_.Open(std::move(r), peer_name, extents);
  }
  void CloseWindow(WindowKey window, absl::AnyInvocable<void() &&> drained) override {
    windows_.Close(window, std::move(drained));
  }
  bool OpenWindowMayWait() const override { return false; }  // two table inserts
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

  // ConnectionHost.
  Handler& handler() override { return handler_; }
  NicStats& nic_stats(int nic) override { return stats_[nic]; }
  const RegionTable& regions() const override { return regions_; }
  const WindowTable& windows() const override { return windows_; }
  uint32_t max_write_bytes() const override { return options_.max_write_bytes; }
  int stall_timeout_ms() const override { return options_.stall_timeout_ms; }
  int ack_timeout_ms() const override { return options_.ack_timeout_ms; }
  absl::Status AdmitHello(int nic, absl::string_view name) override;
  DeviceStager* device_stager() override { return options_.device_stager; }
  absl::string_view node_name() const override { return options_.node_name; }
  const FabricKeys& keys() const override { return *options_.keys; }
  absl::StatusOr<PeerId> AttachInbound(uint64_t connection_id,
                                       absl::string_view name) override;
  void OnAckTimeout(uint64_t connection_id, const absl::Status& why) override;
  void OnConnectionFinished(uint64_t connection_id) override;

 private:
  // RESOURCE_EXHAUSTED (reason FABRIC_PEER_CONNECTIONS), counted on `nic`, when the
  // live peer `name` holds max_connections_per_peer_ open inbound connections.
  absl::Status CheckPeerShare(int nic, absl::string_view name)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  using Peer = PeerTable<ConnectionPtr>::Peer;
  struct ConnectionEntry {
    ConnectionPtr connection;
    PeerId peer = 0;  // 0 until an inbound connection proves itself
  };

  // Opens, and authenticates, every outbound connection of a Connect. Unstarted:
  // dropping them closes their sockets, which is the whole rollback.
  // Opens connections_per_nic connections on every NIC in `nics`.
  absl::StatusOr<std::vector<ConnectionPtr>> OpenConnections(
      absl::string_view peer_name, const std::vector<Endpoint>& remote,
      const NicSet& nics);
  void OnAccepted(int nic, UniqueFd socket);
  // The live peer called `name`, made if there is none. A peer whose connections are
  // all closed is retired here, so that its OnPeerLost still fires.
  PeerId LivePeer(absl::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The reaper thread: joins finished connections, fails their writes, reports lost
  // peers.
  void Reap();
  void ReapOne(uint64_t connection_id);
  bool ReaperHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return reaper_stop_ || !finished_.empty();
  }
  bool AllConnectionsReaped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return connections_.empty();
  }

  const TcpFabricOptions options_;
  Handler& handler_;
  const std::vector<SocketAddress> local_;
  const std::vector<Endpoint> endpoints_;
  std::vector<NicStats> stats_;  // sized once; NicStats is all atomics
  const size_t max_connections_per_peer_;
  RegionTable regions_;
  WindowTable windows_;
  std::atomic<uint64_t> next_connection_id_{1};

  ConnectLocks connect_locks_;  // taken before mu_
  PendingSockets pending_;      // the sockets of the Connects under way
  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool reaper_stop_ ABSL_GUARDED_BY(mu_) = false;
  // Retired here also when found with every connection closed.
  PeerTable<ConnectionPtr> peers_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, ConnectionEntry> connections_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> finished_ ABSL_GUARDED_BY(mu_);  // for the reaper

  std::thread reaper_;
  std::unique_ptr<Acceptor> acceptor_;
};

}  // namespace fuselink::fabric::tcp_internal
