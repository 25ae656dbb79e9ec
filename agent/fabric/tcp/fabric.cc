// The TCP fabric's life (the class: tcp/fabric_impl.h): its options checked, a
// listener bound on every NIC (CreateTcpFabric), the acceptor and the reaper
// started, and the teardown, which closes every connection and waits until the
// reaper has joined them all. Connects, accepts and peers are in fabric_peers.cc;
// posting writes, in fabric_writes.cc.
#include "agent/fabric/tcp/fabric.h"

#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/acceptor.h"
#include "agent/fabric/checks.h"
#include "agent/fabric/peer_table.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/tcp/fabric_impl.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric {
namespace {

static_assert(kMaxConnectionsPerNic * kMaxWireNics <= kMaxConnections,
              "one peer's outbound connections always fit under kMaxConnections");
static_assert(kMaxTcpQueueDepthPerNic <= (1 << 20),
              "a connection's ring holds queue_depth_per_nic writes, allocated up front");

using tcp_internal::TcpFabric;

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
      options.queue_depth_per_nic > kMaxTcpQueueDepthPerNic) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue_depth_per_nic must be 1..", kMaxTcpQueueDepthPerNic));
  }
  if (options.stall_timeout_ms < 1 || options.stall_timeout_ms > kMaxTimeoutMs ||
      options.ack_timeout_ms < 1 || options.ack_timeout_ms > kMaxTimeoutMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("stall_timeout_ms and ack_timeout_ms must be 1..", kMaxTimeoutMs));
  }
  if (options.max_connections_per_peer < 0 ||
      static_cast<size_t>(options.max_connections_per_peer) > kMaxConnections) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_connections_per_peer must be 0..", kMaxConnections));
  }
  return absl::OkStatus();
}

}  // namespace

namespace tcp_internal {

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

void TcpFabric::Reap() {
  NameThisThread("fl-tcp-reaper");
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

}  // namespace tcp_internal

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
