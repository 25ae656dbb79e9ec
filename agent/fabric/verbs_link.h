// One control connection of the verbs fabric: a TCP connection per (peer, NIC) that
// exchanges QP information once and then carries the target's region table to the
// source. No data ever travels on it (frames: verbs_wire.h).
//
// Why a TCP side channel and not the gRPC bootstrap: Fabric::Connect takes only the
// peer's Endpoints, and RC set-up needs a request/response (QPN, PSN, GID, MTU both
// ways) per NIC pair before either side may send; keeping it inside the fabric keeps
// the Fabric interface unchanged and the agent's bootstrap transport-neutral. The
// Endpoint a NIC advertises is this listener, exactly as for the TCP fabric.
//
// Region keys: RegionKey names a region on its own node, but a source needs the
// target's (address, rkey) per NIC to post an RDMA WRITE. The target pushes them:
// each inbound link gets the whole table once in the handshake (before READY), then
// a REGION_ADD for every later RegisterRegion, which returns only once every connected
// source has ACKed it — so a key handed out through the bootstrap always resolves at
// the source. REGION_REMOVE is not waited for: after DeregisterRegion the MR is gone,
// and the target's NIC refuses a late write with a remote access error. The source's
// table is bounded by kMaxRegions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/unique_fd.h"
#include "agent/fabric/verbs_nic.h"
#include "agent/fabric/verbs_wire.h"

namespace fuselink::fabric::verbs {

// How long a handshake may take, and how long RegisterRegion waits for a source's ACK
// before it gives up on that link (and closes it).
inline constexpr int kHandshakeTimeoutMs = 10'000;
inline constexpr absl::Duration kRegionAckTimeout = absl::Seconds(10);

// The target's region, as the source sees it on one NIC.
struct RemoteRegion {
  uint64_t address = 0;
  uint32_t rkey = 0;
};

// What a link needs from its fabric.
class LinkHost {
 public:
  virtual ~LinkHost() = default;
  // An inbound link finished its handshake as `name`: attach it (and activate its
  // QPs) to the peer of that name. Returns the peer.
  virtual absl::StatusOr<PeerId> AttachInbound(uint64_t link, absl::string_view name) = 0;
  // The region table for an inbound link on its NIC; from now on the link receives
  // every REGION_ADD. Called with the link's send lock held.
  virtual std::vector<wire::RegionAdd> StartPushing(uint64_t link) = 0;
  // The link's thread is exiting (or was never started); called once.
  virtual void OnLinkFinished(uint64_t link) = 0;
};

class ControlLink {
 public:
  enum class Role { kOutbound, kInbound };

  ControlLink(LinkHost& host, Nic& nic, uint64_t id, Role role, UniqueFd fd);
  ~ControlLink();
  ControlLink(const ControlLink&) = delete;
  ControlLink& operator=(const ControlLink&) = delete;

  uint64_t id() const { return id_; }
  Role role() const { return role_; }
  Nic& nic() const { return nic_; }

  // Outbound, on the caller's thread: creates `qp_count` QPs, says HELLO as
  // `node_name`, connects the QPs to the reply and reads the region table up to READY.
  // On failure the caller Close()s the link, which tears the QPs down.
  absl::Status Handshake(absl::string_view node_name, uint32_t qp_count);
  // Starts the link's thread: outbound, it applies pushed region frames and ACKs them;
  // inbound, it runs the handshake, then reads ACKs.
  void Start();
  // Shuts the socket down and starts the QPs' teardown. Idempotent, any thread.
  void Close(const absl::Status& why);
  void Join();

  // The QPs, fixed once the handshake is done.
  const std::vector<VerbsQp*>& qps() const { return qps_; }
  // Round-robin over the QPs that take writes; null when none does. The fabric calls
  // it, and Forget, under its own lock, so a QP cannot be freed while chosen.
  VerbsQp* NextQp();
  // The QP is drained and about to be freed.
  void Forget(VerbsQp* qp);

  // Source side.
  std::optional<RemoteRegion> FindRemote(RegionKey key) const;
  // Target side: sends one frame and (for ADD) waits for its ACK.
  absl::Status PushAdd(wire::RegionAdd add);
  void PushRemove(RegionKey key);

 private:
  absl::Status ServeOutbound();
  absl::Status ServeInbound();
  absl::Status AcceptHandshake();
  absl::Status CreateQps(uint32_t count);
  absl::Status ConnectQps(const wire::HelloHeader& hello,
                          const std::vector<wire::QpInfo>& infos);
  absl::Status SendFrame(const wire::Frame& frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(send_mu_);
  absl::StatusOr<wire::Decoded> ReadFrame();
  absl::Status ApplyRegionFrame(const wire::Decoded& frame);
  wire::Hello LocalHello(std::string name) const;

  LinkHost& host_;
  Nic& nic_;
  const uint64_t id_;
  const Role role_;
  UniqueFd fd_;
  std::vector<VerbsQp*> qps_;  // written by the handshake only
  std::atomic<uint32_t> next_qp_{0};

  mutable absl::Mutex close_mu_;
  absl::Status close_reason_ ABSL_GUARDED_BY(close_mu_);
  bool closed_ ABSL_GUARDED_BY(close_mu_) = false;

  absl::Mutex send_mu_;  // one writer of the socket at a time
  uint64_t next_seq_ ABSL_GUARDED_BY(send_mu_) = 1;

  mutable absl::Mutex ack_mu_;
  uint64_t acked_seq_ ABSL_GUARDED_BY(ack_mu_) = 0;
  bool ack_dead_ ABSL_GUARDED_BY(ack_mu_) = false;  // no ACK will come any more

  mutable absl::Mutex remote_mu_;
  std::unordered_map<RegionKey, RemoteRegion> remote_ ABSL_GUARDED_BY(remote_mu_);

  std::thread thread_;
};

}  // namespace fuselink::fabric::verbs
