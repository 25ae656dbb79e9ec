// The TCP fabric's connections and peers (the class: tcp/fabric_impl.h): Connect
// opens and authenticates a peer's missing outbound connections, NIC by NIC; an
// accepted connection stays unproven (the oldest closed past
// kMaxUnprovenConnections) until its HELLO attaches it to a peer, within that
// peer's share of accepted connections; an ACK timeout closes its siblings on
// the NIC; a peer whose connections have all closed is retired for a new one.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/checks.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/tcp/fabric_impl.h"
#include "agent/fabric/tcp/handshake.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric::tcp_internal {
namespace {

// A peer's inbound connections still open: its share in use.
template <typename Links>
size_t OpenInbound(const Links& links) {
  return static_cast<size_t>(std::count_if(links.begin(), links.end(), [](const auto& c) {
    return c->role() == TcpConnection::Role::kInbound && !c->closed();
  }));
}

}  // namespace

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

}  // namespace fuselink::fabric::tcp_internal
