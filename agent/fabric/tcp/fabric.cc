#include "agent/fabric/tcp/fabric.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/acceptor.h"
#include "agent/fabric/checks.h"
#include "agent/fabric/peer_table.h"
#include "agent/fabric/region_table.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/tcp/connection.h"
#include "agent/fabric/tcp/handshake.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric {
namespace {

static_assert(kMaxConnectionsPerNic * kMaxWireNics <= kMaxConnections,
              "one peer's outbound connections always fit under kMaxConnections");
static_assert(kMaxQueueDepthPerNic <= (1 << 20),
              "a connection's ring holds queue_depth_per_nic writes, allocated up front");

using ConnectionPtr = std::shared_ptr<TcpConnection>;

absl::Status ValidateOptions(const TcpFabricOptions& options, const Handler* handler) {
  FL_RETURN_IF_ERROR(
      CheckFabricBasics(handler, options.keys, options.node_name, options.nics));
  if (options.connections_per_nic < 1 ||
      options.connections_per_nic > kMaxConnectionsPerNic) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections_per_nic must be 1..", kMaxConnectionsPerNic));
  }
  if (options.max_write_bytes < 1 ||
      options.max_write_bytes > wire::kMaxWriteBytesLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_write_bytes must be 1..", wire::kMaxWriteBytesLimit));
  }
  if (options.queue_depth_per_nic < 1 ||
      options.queue_depth_per_nic > kMaxQueueDepthPerNic) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue_depth_per_nic must be 1..", kMaxQueueDepthPerNic));
  }
  if (options.stall_timeout_ms < 1 || options.stall_timeout_ms > kMaxFabricTimeoutMs ||
      options.ack_timeout_ms < 1 || options.ack_timeout_ms > kMaxFabricTimeoutMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stall_timeout_ms and ack_timeout_ms must be 1..", kMaxFabricTimeoutMs));
  }
  if (options.max_connections_per_peer < 0 ||
      static_cast<size_t>(options.max_connections_per_peer) > kMaxConnections) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_connections_per_peer must be 0..", kMaxConnections));
  }
  return absl::OkStatus();
}

// A peer's inbound connections still open: its share in use.
template <typename Links>
size_t OpenInbound(const Links& links) {
  return static_cast<size_t>(std::count_if(links.begin(), links.end(), [](const auto& c) {
    return c->role() == TcpConnection::Role::kInbound && !c->closed();
  }));
}

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

absl::Status TcpFabric::Start(std::vector<UniqueFd> listeners) {
  reaper_ = std::thread(&TcpFabric::Reap, this);
  FL_ASSIGN_OR_RETURN(acceptor_,
                      Acceptor::Start(std::move(listeners), [this](int nic, UniqueFd s) {
                        OnAccepted(nic, std::move(s));
                      }));
  return absl::OkStatus();
}

TcpFabric::~TcpFabric() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  acceptor_.reset();  // no accepts from here on
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, entry] : connections_) {
      entry.connection->Close(absl::CancelledError("fabric shutting down"));
    }
    mu_.Await(absl::Condition(this, &TcpFabric::AllConnectionsReaped));
    reaper_stop_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
}

absl::StatusOr<std::vector<ConnectionPtr>> TcpFabric::OpenConnections(
    absl::string_view peer_name, const std::vector<Endpoint>& remote,
    const NicSet& nics) {
  const std::optional<SessionKey> key = options_.keys->FindConnectKey(peer_name);
  if (!key.has_value()) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "no fabric key for '", BoundedForMessage(peer_name),
                          "': the peer bootstrap has not introduced it yet")),
                      reasons::kFabricNoKey);
  }
  std::vector<ConnectionPtr> opened;
  for (size_t nic = 0; nic < remote.size(); ++nic) {
    if (!nics.test(nic)) continue;
    FL_ASSIGN_OR_RETURN(SocketAddress target,
                        ParseSocketAddress(remote[nic].address, remote[nic].port));
    const std::string context =
        absl::StrCat("Connect to '", peer_name, "': NIC ", nic, " (",
                     endpoints_[nic].address, " -> ", target.ToString(), ")");
    for (int i = 0; i < options_.connections_per_nic; ++i) {
      absl::StatusOr<UniqueFd> bound = BoundDataSocket(local_[nic], target);
      if (!bound.ok()) return WithContext(bound.status(), context);
      UniqueFd socket = *std::move(bound);
      // Declared after the socket: the ticket ends before the socket can close.
      FL_ASSIGN_OR_RETURN(PendingSockets::Ticket pending, pending_.Track(socket.get()));
      absl::Status made =
          ConnectSocket(socket.get(), target, kConnectTimeoutMs, &pending_);
      if (made.ok()) {
        made = ProveToAcceptor(socket.get(), static_cast<uint32_t>(nic),
                               options_.node_name, peer_name, *key, kHelloTimeoutMs);
      }
      if (!made.ok()) return pending_.OrCancelled(WithContext(made, context));
      opened.push_back(std::make_shared<TcpConnection>(
          *this, next_connection_id_.fetch_add(1), static_cast<int>(nic),
          TcpConnection::Role::kOutbound, std::move(socket),
          options_.queue_depth_per_nic));
    }
  }
  return opened;
}

absl::StatusOr<PeerId> TcpFabric::Connect(absl::string_view peer_name,
                                          const std::vector<Endpoint>& remote) {
  FL_MAY_BLOCK();  // the handshakes
  FL_RETURN_IF_ERROR(wire::ValidateNodeName(peer_name));
  FL_RETURN_IF_ERROR(CheckRemoteEndpoints(remote, endpoints_.size()));
  absl::MutexLock connect_lock(&connect_locks_.For(peer_name));
  NicSet missing = FirstNics(remote.size());  // NICs without a live connection
  std::optional<PeerId> existing;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (std::optional<PeerId> id = peers_.Find(peer_name)) {
      for (const ConnectionPtr& c : peers_.Get(*id)->links) {
        if (c->role() == TcpConnection::Role::kOutbound && !c->closed()) {
          missing.reset(c->nic());
          existing = id;
        }
      }
    }
  }
  if (existing && missing.none()) return *existing;
  absl::StatusOr<std::vector<ConnectionPtr>> maybe_opened =
      OpenConnections(peer_name, remote, missing);
  // A connected peer whose failed NICs cannot be re-opened yet stays connected on the
  // others; the caller repairs again later.
  if (!maybe_opened.ok()) {
    if (existing) return *existing;
    return maybe_opened.status();
  }
  std::vector<ConnectionPtr> opened = *std::move(maybe_opened);
  // Cancelled after the handshakes: their sockets may be shut down already.
  FL_RETURN_IF_ERROR(pending_.OrCancelled(absl::OkStatus()));
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::FailedPreconditionError("fabric shutting down");
  if (connections_.size() + opened.size() > kMaxConnections) {
    return absl::ResourceExhaustedError(
        absl::StrCat("already ", connections_.size(), " connections open"));
  }
  const PeerId id = LivePeer(peer_name);
  for (ConnectionPtr& connection : opened) {
    connections_.emplace(connection->id(), ConnectionEntry{connection, id});
    peers_.Get(id)->links.push_back(connection);
    connection->Start();
  }
  return id;
}

void TcpFabric::Disconnect(PeerId peer) {
  absl::MutexLock lock(&mu_);
  peers_.Disconnect(peer);
}

std::string TcpFabric::PeerName(PeerId peer) const {
  absl::ReaderMutexLock lock(&mu_);
  return peers_.Name(peer);
}

absl::Status TcpFabric::PostWrite(PeerId peer, int nic, const WriteOp& op) {
  FL_RETURN_IF_ERROR(CheckWrite(nic, nic_count(), op, options_.max_write_bytes));
  PendingWrite write{.op = op, .source = nullptr};
  if (op.bytes > 0) {
    absl::StatusOr<std::shared_ptr<const Region>> source =
        regions_.Find(op.local_key, op.local_offset, op.bytes);
    if (!source.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("local extent: ", source.status().message()));
    }
    write.source = *std::move(source);
  }

  absl::ReaderMutexLock lock(&mu_);
  const Peer* to = peers_.Get(peer);
  if (to == nullptr || to->retired) {
    return absl::UnavailableError(absl::StrCat("peer ", peer, " is not connected"));
  }
  TcpConnection* least_queued = nullptr;
  for (const ConnectionPtr& connection : to->links) {
    if (connection->role() != TcpConnection::Role::kOutbound ||
        connection->nic() != nic || connection->closed()) {
      continue;
    }
    if (least_queued == nullptr || connection->queued() < least_queued->queued()) {
      least_queued = connection.get();
    }
  }
  if (least_queued == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("peer '", to->name, "' is not connected on NIC ", nic));
  }
  std::atomic<int>& outstanding = stats_[nic].outstanding_writes;
  FL_RETURN_IF_ERROR(TakeWriteSlot(outstanding, options_.queue_depth_per_nic, nic));
  absl::Status queued = least_queued->Enqueue(std::move(write));
  if (!queued.ok()) outstanding.fetch_sub(1, std::memory_order_acq_rel);
  return queued;
}

NicCounters TcpFabric::counters(int nic) const {
  if (nic < 0 || nic >= nic_count()) return {};
  const NicStats& stats = stats_[nic];
  return NicCounters{
      .transmitted_bytes = stats.transmitted_bytes.load(std::memory_order_relaxed),
      .received_bytes = stats.received_bytes.load(std::memory_order_relaxed),
      .wire_tx_bytes = stats.wire_tx_bytes.load(std::memory_order_relaxed),
      .wire_rx_bytes = stats.wire_rx_bytes.load(std::memory_order_relaxed),
      .malformed_frames = stats.malformed_frames.load(std::memory_order_relaxed),
      .refused_writes = stats.refused_writes.load(std::memory_order_relaxed),
      .auth_failures = stats.auth_failures.load(std::memory_order_relaxed),
      .stalled_connections = stats.stalled_connections.load(std::memory_order_relaxed),
      .ack_timeouts = stats.ack_timeouts.load(std::memory_order_relaxed),
      .peer_connection_refusals =
          stats.peer_connection_refusals.load(std::memory_order_relaxed)};
}

void TcpFabric::OnAccepted(int nic, UniqueFd socket) {
  if (!ConfigureDataSocket(socket.get()).ok()) return;  // drops the client
  auto connection = std::make_shared<TcpConnection>(
      *this, next_connection_id_.fetch_add(1), nic, TcpConnection::Role::kInbound,
      std::move(socket), 0);
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  // Inbound connections not yet attached to a peer (peer 0), oldest first (ids grow).
  size_t unproven = 0;
  ConnectionEntry* oldest = nullptr;
  for (auto& [id, entry] : connections_) {
    if (entry.peer != 0 || entry.connection->role() != TcpConnection::Role::kInbound) {
      continue;
    }
    ++unproven;
    if (oldest == nullptr) oldest = &entry;
  }
  if (unproven >= handshake::kMaxUnprovenConnections && oldest != nullptr) {
    // Counted here: a connection this side closed does not count itself.
    stats_[oldest->connection->nic()].auth_failures.fetch_add(1,
                                                              std::memory_order_relaxed);
    oldest->connection->Close(absl::UnavailableError(
        "closed unproven for a newer connection (too many in their handshake)"));
  }
  if (connections_.size() >= kMaxConnections) return;
  connections_.emplace(connection->id(), ConnectionEntry{connection, 0});
  connection->Start();
}

absl::Status TcpFabric::CheckPeerShare(int nic, absl::string_view name) {
  const std::optional<PeerId> id = peers_.Find(name);
  if (!id.has_value()) return absl::OkStatus();
  const size_t open = OpenInbound(peers_.Get(*id)->links);
  if (open < max_connections_per_peer_) return absl::OkStatus();
  stats_[nic].peer_connection_refusals.fetch_add(1, std::memory_order_relaxed);
  return WithReason(absl::ResourceExhaustedError(absl::StrCat(
                        "peer '", BoundedForMessage(name), "' holds ", open,
                        " connections to this node, its share (max_connections_per_peer ",
                        max_connections_per_peer_, ")")),
                    kPeerConnectionsReason);
}

absl::Status TcpFabric::AdmitHello(int nic, absl::string_view name) {
  absl::ReaderMutexLock lock(&mu_);
  return CheckPeerShare(nic, name);
}

absl::StatusOr<PeerId> TcpFabric::AttachInbound(uint64_t connection_id,
                                                absl::string_view name) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::CancelledError("fabric shutting down");
  ConnectionEntry& entry = connections_.at(connection_id);
  // Checked again: connections of the same peer may have passed AdmitHello together.
  FL_RETURN_IF_ERROR(CheckPeerShare(entry.connection->nic(), name));
  entry.peer = LivePeer(name);
  peers_.Get(entry.peer)->links.push_back(entry.connection);
  return entry.peer;
}

void TcpFabric::OnAckTimeout(uint64_t connection_id, const absl::Status& why) {
  absl::ReaderMutexLock lock(&mu_);
  auto it = connections_.find(connection_id);
  if (it == connections_.end()) return;
  const Peer* peer = peers_.Get(it->second.peer);
  if (peer == nullptr) return;
  const int nic = it->second.connection->nic();
  for (const ConnectionPtr& sibling : peer->links) {
    if (sibling->role() == TcpConnection::Role::kOutbound && sibling->nic() == nic) {
      sibling->Close(why);  // its own as well: idempotent
    }
  }
}

void TcpFabric::OnConnectionFinished(uint64_t connection_id) {
  absl::MutexLock lock(&mu_);
  finished_.push_back(connection_id);
}

PeerId TcpFabric::LivePeer(absl::string_view name) {
  if (std::optional<PeerId> id = peers_.Find(name)) {
    const std::vector<ConnectionPtr>& links = peers_.Get(*id)->links;
    if (std::any_of(links.begin(), links.end(),
                    [](const ConnectionPtr& c) { return !c->closed(); })) {
      return *id;
    }
    peers_.Retire(*id);
  }
  return peers_.Add(name);
}

void TcpFabric::Reap() {
  while (true) {
    uint64_t connection_id;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &TcpFabric::ReaperHasWork));
      if (finished_.empty()) return;  // stopping, and nothing left
      connection_id = finished_.front();
      finished_.pop_front();
    }
    ReapOne(connection_id);
  }
}

void TcpFabric::ReapOne(uint64_t connection_id) {
  ConnectionPtr connection;
  {
    absl::ReaderMutexLock lock(&mu_);
    connection = connections_.at(connection_id).connection;
  }
  // Every thread of the connection is gone after this, and so is every write on it.
  connection->JoinAndFailPending();

  PeerId peer_id = 0;
  std::optional<std::string> lost;
  {
    absl::MutexLock lock(&mu_);
    auto entry = connections_.find(connection_id);
    peer_id = entry->second.peer;
    connections_.erase(entry);
    if (peer_id != 0) lost = peers_.RemoveLink(peer_id, connection);
  }
  if (lost.has_value()) {
    handler_.OnPeerLost(peer_id, *lost, PeerLostStatus(connection->close_reason()));
  }
}

}  // namespace

int DefaultConnectionsPerPeer(const TcpFabricOptions& options) {
  return 2 * options.connections_per_nic * static_cast<int>(options.nics.size());
}

absl::StatusOr<std::unique_ptr<Fabric>> CreateTcpFabric(const TcpFabricOptions& options,
                                                        Handler* handler) {
  FL_RETURN_IF_ERROR(ValidateOptions(options, handler));
  std::vector<UniqueFd> listeners;
  std::vector<SocketAddress> local;
  std::vector<Endpoint> endpoints;
  for (const Endpoint& nic : options.nics) {
    const std::string context = absl::StrCat("NIC ", nic.nic, " (", nic.address, ")");
    absl::StatusOr<SocketAddress> address = ParseSocketAddress(nic.address, nic.port);
    if (!address.ok()) return WithContext(address.status(), context);
    absl::StatusOr<UniqueFd> listener = Listen(*address);
    if (!listener.ok()) return WithContext(listener.status(), context);
    FL_ASSIGN_OR_RETURN(SocketAddress bound, LocalAddress(listener->get()));
    endpoints.push_back(
        Endpoint{.nic = nic.nic, .address = nic.address, .port = bound.port()});
    FL_ASSIGN_OR_RETURN(SocketAddress outbound, ParseSocketAddress(nic.address, 0));
    local.push_back(outbound);
    listeners.push_back(*std::move(listener));
  }
  auto fabric = std::make_unique<TcpFabric>(options, *handler, std::move(local),
                                            std::move(endpoints));
  FL_RETURN_IF_ERROR(fabric->Start(std::move(listeners)));
  return fabric;
}

}  // namespace fuselink::fabric
