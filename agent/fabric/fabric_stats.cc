// The per-NIC counters every transport keeps (NicCounters), as stats series.
#include "agent/fabric/fabric.h"

namespace fuselink::fabric {

namespace {

using stats::Kind;

constexpr stats::Family kMalformed{
    "fuselink_fabric_malformed_frames_total",
    "Frames from peers that were refused and closed their connection.", Kind::kCounter};
constexpr stats::Family kAuthFailures{
    "fuselink_fabric_auth_failures_total",
    "Connections accepted on the NIC that closed before they proved they belong to "
    "an authenticated peer (the fabric handshake).",
    Kind::kCounter};
constexpr stats::Family kRefusedWrites{
    "fuselink_fabric_refused_writes_total",
    "Writes that arrived on the NIC and were refused before a byte landed: no open "
    "window under their key, another peer's window, or outside it.",
    Kind::kCounter};
constexpr stats::Family kStalled{
    "fuselink_fabric_stalled_connections_total",
    "Connections accepted on the NIC that closed because a frame, once begun, sent "
    "no byte for --fabric_stall_timeout_ms (or an ACK found no room as long).",
    Kind::kCounter};
constexpr stats::Family kAckTimeouts{
    "fuselink_fabric_ack_timeouts_total",
    "Connections (TCP) or QPs (verbs) of this node on the NIC that closed because "
    "their writes saw no acknowledgement for --fabric_ack_timeout_ms; the writes went "
    "again.",
    Kind::kCounter};
constexpr stats::Family kConnectionRefusals{
    "fuselink_fabric_peer_connection_refusals_total",
    "Connections accepted on the NIC and refused because their peer held its share "
    "already (--fabric_connections_per_peer).",
    Kind::kCounter};
constexpr stats::Family kStagedShareWaits{
    "fuselink_fabric_staged_share_waits_total",
    "Staged writes out of GPU memory (verbs) that waited because their peer held its "
    "share of the NIC's bounce slots (--rdma_staging_slots_per_peer) while other "
    "peers' writes went on.",
    Kind::kCounter};
// How each GPU's memory crosses each NIC (verbs/staging.h): one series per pair.
constexpr stats::Family kGpuPath{
    "fuselink_gpu_nic_path",
    "1 for each GPU and NIC: how the transport moves that GPU's memory over the NIC "
    "(dma-buf, peer-memory: the NIC reaches it; staged: through pinned host memory; "
    "none).",
    Kind::kGauge};

}  // namespace

void Fabric::ReportStats(stats::Sink& sink, int gpus) const {
  const int nics = std::min(sink.nic_count(), nic_count());
  for (int k = 0; k < nics; ++k) {
    const NicCounters c = counters(k);
    sink.AddPerNic(kMalformed, k, static_cast<double>(c.malformed_frames));
    sink.AddPerNic(kAuthFailures, k, static_cast<double>(c.auth_failures));
    sink.AddPerNic(kRefusedWrites, k, static_cast<double>(c.refused_writes));
    sink.AddPerNic(kStalled, k, static_cast<double>(c.stalled_connections));
    sink.AddPerNic(kAckTimeouts, k, static_cast<double>(c.ack_timeouts));
    sink.AddPerNic(kConnectionRefusals, k,
                   static_cast<double>(c.peer_connection_refusals));
    sink.AddPerNic(kStagedShareWaits, k, static_cast<double>(c.staged_share_waits));
  }
  // Labelled gpu and nic (the NIC's name only, not its owner GPU).
  for (int g = 0; g < gpus; ++g) {
    for (int k = 0; k < nics; ++k) {
      sink.Add(
          kGpuPath,
          {{"gpu", absl::StrCat(g)}, {"nic", sink.nic_name(k)}, {"path", GpuPath(g, k)}},
          1);
    }
  }
}

}  // namespace fuselink::fabric
