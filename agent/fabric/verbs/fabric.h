// The Fabric over RDMA verbs (RoCE v2, RC QPs), same semantics as the TCP fabric:
// peers keyed by name (one PeerId per name whether we connected or were connected
// to), every write completed exactly once, OnPeerLost after all of a peer's
// completions, 0-byte writes are notifications carrying only the immediate.
//
// Layout per NIC (verbs/nic.h): one device context, PD and CQ, polled by one thread;
// per (peer, NIC) one control connection (verbs/link.h) and qps_per_peer_nic RC QPs.
// Writes are spread round-robin over a NIC's QPs to the peer. The connecting side
// posts on its QPs; the accepting side only receives on them (to write back, it
// Connect()s too, as with TCP).
//
// Windows (verbs/window.h, verbs/link.h): OpenWindow registers every extent of the
// window separately on every NIC, in the named peer's protection domain there, and
// pushes the rkeys to that peer alone; CloseWindow deregisters them (on the fabric's
// worker thread) before `drained` runs, so a late write fails at the target's NIC. A
// region's own registration is local only (lkeys for reads; no remote access).
//
// GPU regions (verbs/staging.h): each (GPU, NIC) pair moves GPU memory by dma-buf,
// peer memory or staging through host memory, chosen at start-up (GpuPath). Staged
// writes and writes behind a fence (the relay's NVLink copy) go through the NIC's
// sender thread: PostWrite returns at once and the write completes as any other. They
// queue per peer, in order, and one peer holds at most staging_slots_per_peer of the
// NIC's bounce slots, so a peer whose writes are stuck holds up only its own
// (verbs/staged_sender.h).
// Staged arrivals are copied to the GPU on the NIC's lander thread before they are
// delivered; a NIC's arrivals stay in order behind them.
//
// What a caller sees against TCP:
//  - Refusals carry the same codes: a write the source cannot map to one of the
//    window's registrations is not sent; the target's answer to a QUERY on the control
//    link says why (NOT_FOUND WINDOW_CLOSED, PERMISSION_DENIED WINDOW_NOT_YOURS,
//    OUT_OF_RANGE OUTSIDE_WINDOW). A write that meets a closed window at the target's
//    NIC (it was posted before the source heard of the close) completes NOT_FOUND
//    WINDOW_CLOSED, Refusal::kNoWindow.
//  - That NIC refusal puts the RC QP into error at both ends; the fabric renews the QP
//    and posts the writes that were flushed behind the refused one again, so they
//    complete as if nothing happened (later, by the renewal's time). If the renewal
//    fails (kRenewTimeout, or the peer cannot make a new QP), they complete
//    UNAVAILABLE and that QP is gone; the NIC's other QPs are untouched.
//  - The arrival for a write whose bytes landed before CloseWindow but whose
//    descriptor is seen after it is not delivered (counted in refused_writes).
//  - Authentication as over TCP (tcp/fabric.h): a control connection proves its key
//    before the target makes a QP for it (verbs/link.h); Connect fails
//    FAILED_PRECONDITION (FABRIC_NO_KEY) or UNAVAILABLE (FABRIC_AUTH) likewise, and
//    NicCounters::auth_failures counts the control connections refused. A peer holds
//    at most max_links_per_peer accepted control connections (as TCP's
//    max_connections_per_peer), and a control frame once begun must keep coming
//    (stall_timeout_ms, FABRIC_STALL) as a TCP frame must.
//  - A port going down (IBV_EVENT_PORT_ERR) closes every QP on that NIC at once; a QP
//    whose peer stops answering fails after the RC retries (timeout, retry_cnt); a
//    receiver that stops reposting is answered RNR by its NIC, and the QP fails after
//    the finite RNR retries (about 0.29 s: verbs::RcParams); on top, a QP whose
//    writes see no acknowledgement within ack_timeout is closed (the watchdog).
//    Either closes the QP with FABRIC_ACK_TIMEOUT and counts in ack_timeouts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/fabric_keys.h"
#include "agent/fabric/verbs/wrap.h"

namespace fuselink::fabric {

// Bounds on the options, checked by CreateVerbsFabric (with kMaxVerbsQueueDepthPerNic,
// kMaxWrDepth and kMaxTimeoutMs, agent/common/limits.h).
// Bounce slots one NIC may have for staged GPU memory (staging_slots_per_nic).
inline constexpr uint32_t kMaxStagingSlotsPerNic = 4096;
// Control connections one fabric holds at once.
inline constexpr size_t kMaxVerbsLinks = 4096;
// The most window registrations (one per extent) max_window_registrations_per_nic may
// allow.
inline constexpr uint32_t kMaxWindowRegistrationsPerNic = 1 << 20;

// A peer's share of `slots` bounce slots when none is set: three quarters, one at least
// left to the others (8: 6; 4: 3; 2: 1; 1: 1).
constexpr uint32_t DefaultSlotsPerPeer(uint32_t slots) {
  return slots > 1 ? slots - std::max(slots / 4, uint32_t{1}) : 1;
}

struct VerbsFabricOptions {
  // Introduces this node in the QP handshake; 1..255 printable ASCII characters.
  std::string node_name;
  // NIC i is the RDMA port whose RoCE v2 GID is nics[i].address (IPv4 or global
  // IPv6, see verbs::BindAddress) and listens for control connections on
  // nics[i].address:nics[i].port (0: the kernel picks).
  std::vector<Endpoint> nics;
  // RC QPs per (peer, NIC) pair.
  int qps_per_peer_nic = 2;
  // Writes in flight on one QP, and receives kept posted on one QP: twice as many, so
  // that receiver-not-ready (and, past the RC retries, a failed QP) needs a target
  // whose poller is two of a source's windows behind (verbs::RcParams::rnr_retry).
  uint32_t wr_depth_per_qp = 128;
  uint32_t recv_depth_per_qp = 256;
  // Writes in flight on one NIC over all its QPs: the CQE quota.
  int queue_depth_per_nic = 512;
  // QPs one NIC holds (both roles, every peer): sizes the CQ and the receive arena.
  uint32_t max_qps_per_nic = 64;
  // The largest write; both sides must agree.
  uint32_t max_write_bytes = 64 << 20;
  // Registrations one NIC holds for open windows, one per extent of each: OpenWindow
  // answers RESOURCE_EXHAUSTED beyond. At most the device's max_mr.
  uint32_t max_window_registrations_per_nic = 1 << 16;
  // Tell a window's peer when the window closes (WINDOW_REMOVE), so that it refuses
  // later writes itself rather than sending them into the target's NIC. false only in
  // tests: every late write then meets the NIC (and a QP renewal).
  bool push_window_closes = true;
  // RC timeout, retry_cnt, rnr_retry and the rest, explicit.
  verbs::RcParams rc;
  // A QP whose outstanding writes see no acknowledgement for this long is closed and
  // they complete UNAVAILABLE (to be failed over): the bound on a write in flight
  // whatever the RC retries do. verbs::NicSizing::ack_timeout.
  absl::Duration ack_timeout = absl::Seconds(10);
  // Control connections, either end: once a frame has begun (a WINDOW_ADD and its
  // records alike), the longest the peer may send no byte of it. Past it the link
  // closes as on an error (its QPs with it: their writes UNAVAILABLE, to be failed
  // over), DEADLINE_EXCEEDED with reason FABRIC_STALL, counted in
  // NicCounters::stalled_connections. Idle between frames is not bounded. Judged
  // every quarter of it (kStallTicks): the close comes 1x to 1.25x this after the
  // last byte. 1..3'600'000.
  int stall_timeout_ms = 10'000;
  // Accepted control connections one authenticated peer may hold open at once; past
  // it a new one is refused after its PROOF (REFUSE), before it gets a QP or a
  // window: RESOURCE_EXHAUSTED, reason FABRIC_PEER_CONNECTIONS, counted in
  // NicCounters::peer_connection_refusals. 0: DefaultLinksPerPeer.
  // 0..kMaxVerbsLinks.
  int max_links_per_peer = 0;
  // GPU memory (verbs/staging.h). The stager copies it where a NIC cannot reach it
  // and exports it as dma-buf where it can; null: GPU regions are refused
  // (UNIMPLEMENTED). Must outlive the fabric. The path of GPUs 0..gpu_count-1 to
  // every NIC is probed at start-up.
  DeviceStager* device_stager = nullptr;
  int gpu_count = 0;
  // [gpu][nic]: false where the NIC is too far from the GPU to reach its memory
  // itself (topo::GpuDirectReaches): that pair stages without a probe. Empty: every
  // pair may.
  std::vector<std::vector<bool>> gpu_direct;
  // Bounce slots per NIC for staged writes out of GPU memory, and their size (the
  // largest staged write).
  uint32_t staging_slots_per_nic = 8;
  uint32_t staging_slot_bytes = 4 << 20;
  // The most of a NIC's bounce slots one peer holds at once (its share), so that a
  // peer whose writes are stuck leaves the rest to the others; its next staged write
  // waits meanwhile, the other peers' go on (verbs/staged_sender.h).
  // 0..staging_slots_per_nic; 0: DefaultSlotsPerPeer.
  uint32_t staging_slots_per_peer = 0;
  // Pinned host memory all open windows' host shadows may take (staged writes into
  // GPU memory); OpenWindow answers RESOURCE_EXHAUSTED beyond.
  uint64_t max_shadow_bytes = uint64_t{1} << 30;
  // Where the peer-memory module is looked for.
  std::string sysfs_root = "/sys";
  // Required: the keys this node proves and checks on its control connections.
  // Must outlive the fabric.
  FabricKeys* keys = nullptr;
};

// Twice what a peer configured like this node opens: one control connection per NIC
// (the NIC count is the same on both sides), and room for one per NIC still closing
// while its replacement is made.
int DefaultLinksPerPeer(const VerbsFabricOptions& options);

// INVALID_ARGUMENT for options out of bounds or without keys; NOT_FOUND /
// FAILED_PRECONDITION when a NIC address has no active RDMA port; the verbs or socket
// failure otherwise, naming the NIC. `handler` must outlive the fabric.
absl::StatusOr<std::unique_ptr<Fabric>> CreateVerbsFabric(
    const VerbsFabricOptions& options, Handler* handler);

}  // namespace fuselink::fabric
