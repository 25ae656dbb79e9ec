// Posting a write on the TCP fabric (the class: tcp/fabric_impl.h): its source
// extent found in its region, the peer's least-queued open outbound connection
// on the NIC chosen, a place in the NIC's queue depth taken, and the write queued
// for that connection's sender (connection.cc); and the NICs' counters.
#include <atomic>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/checks.h"
#include "agent/fabric/tcp/fabric_impl.h"

namespace fuselink::fabric::tcp_internal {

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

}  // namespace fuselink::fabric::tcp_internal
