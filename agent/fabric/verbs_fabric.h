// The Fabric over RDMA verbs (RoCE v2, RC QPs), same semantics as the TCP fabric:
// peers keyed by name (one PeerId per name whether we connected or were connected
// to), every write completed exactly once, OnPeerLost after all of a peer's
// completions, 0-byte writes are notifications carrying only the immediate.
//
// Layout per NIC (verbs_nic.h): one device context, PD and CQ, polled by one thread;
// per (peer, NIC) one control connection (verbs_link.h) and qps_per_peer_nic RC QPs.
// Writes are spread round-robin over a NIC's QPs to the peer. The connecting side
// posts on its QPs; the accepting side only receives on them (to write back, it
// Connect()s too, as with TCP).
//
// Differences a caller sees against TCP:
//  - PostWrite answers NOT_FOUND synchronously for a remote key the target has not
//    pushed (never, for a key it registered before handing it out: RegisterRegion
//    waits for every connected source's ACK).
//  - A write outside the target region is refused by the target's NIC (the MR bounds):
//    it completes OUT_OF_RANGE ("remote access error"), and that QP — only that one —
//    goes to error, so its other writes in flight complete UNAVAILABLE. TCP closes
//    the connection in the same case.
//  - A port going down (IBV_EVENT_PORT_ERR) closes every QP on that NIC at once; a QP
//    whose peer stops answering fails after the RC retries (timeout, retry_cnt).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/verbs_wrap.h"

namespace fuselink::fabric {

// Bounds on the options, checked by CreateVerbsFabric.
inline constexpr int kMaxVerbsQueueDepthPerNic = 1 << 16;
// Control connections one fabric holds at once.
inline constexpr size_t kMaxVerbsLinks = 4096;

struct VerbsFabricOptions {
  // Introduces this node in the QP handshake; 1..255 printable ASCII characters.
  std::string node_name;
  // NIC i is the RDMA port whose RoCE v2 GID is nics[i].address (IPv4) and listens
  // for control connections on nics[i].address:nics[i].port (0: the kernel picks).
  std::vector<Endpoint> nics;
  // RC QPs per (peer, NIC) pair.
  int qps_per_peer_nic = 2;
  // Writes in flight on one QP, and receives kept posted on one QP.
  uint32_t wr_depth_per_qp = 128;
  uint32_t recv_depth_per_qp = 128;
  // Writes in flight on one NIC over all its QPs: the CQE quota.
  int queue_depth_per_nic = 512;
  // QPs one NIC holds (both roles, every peer): sizes the CQ and the receive arena.
  uint32_t max_qps_per_nic = 64;
  // The largest write; both sides must agree.
  uint32_t max_write_bytes = 64 << 20;
  // RC timeout, retry_cnt, rnr_retry and the rest, explicit.
  verbs::RcParams rc;
};

// INVALID_ARGUMENT for options out of bounds; NOT_FOUND / FAILED_PRECONDITION when a
// NIC address has no active RDMA port; the verbs or socket failure otherwise, naming
// the NIC. `handler` must outlive the fabric.
absl::StatusOr<std::unique_ptr<Fabric>> CreateVerbsFabric(
    const VerbsFabricOptions& options, Handler* handler);

}  // namespace fuselink::fabric
