// The fabric: one-sided writes from a local region into a peer's registered region,
// over the node's NICs. Shaped after RDMA WRITE WITH IMMEDIATE so that a verbs
// transport and the TCP transport serve the same callers:
//  - the target registers memory once; for each incoming transfer it opens a window
//    on that memory for the one peer that sends it, over exactly the extents the
//    transfer fills, and hands the window's key to the source (out of band, through
//    the peer bootstrap). Region keys never leave the node;
//  - the source posts a write (local extent -> window key + region offset, with a
//    32-bit immediate) on a NIC; the target places the bytes only if they lie inside
//    that window and the window is that peer's, and is told of the arrival with the
//    immediate; the source's completion fires once the target has placed them, or
//    carries the target's refusal (nothing placed) otherwise;
//  - the target closes the window when the transfer ends there: from then on the
//    key places nothing, and a write already placing finishes before the close is
//    reported drained.
// NIC i of one node talks to NIC i of every peer (one rail per NIC index).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "agent/common/stats.h"
#include "agent/common/unique_fd.h"

namespace fuselink::fabric {

// Names a registered region on its own node. 0 is never a valid key.
using RegionKey = uint32_t;
// Names an open window: one peer's right to write some extents of one region. Drawn
// at random (not guessable from other keys); 0 is never a valid key.
using WindowKey = uint32_t;
// Names a connected peer on this node; assigned by Connect or by an accepted HELLO.
using PeerId = uint32_t;

// Where one of a node's NICs accepts fabric connections.
struct Endpoint {
  int nic = 0;
  std::string address;
  uint16_t port = 0;
};

// Device work a write's source waits for (a relay copy still on the GPU): the fabric
// waits for it before it reads the source, on its own thread. Only GPU regions bring
// fences; a fabric without GPU memory (no DeviceStager) refuses fenced writes.
class Fence {
 public:
  virtual ~Fence() = default;
  virtual absl::Status Wait() = 0;
};

// A byte range of a region, in offsets from the region's first byte.
struct Extent {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Extents one window may hold.
inline constexpr size_t kMaxWindowExtents = 1 << 16;

// Why a target refused a write without placing any of its bytes.
enum class Refusal : uint32_t {
  kNone = 0,
  kNoWindow = 1,       // no open window under that key: closed, or never opened
  kNotYourWindow = 2,  // the window belongs to another peer
  kOutsideWindow = 3,  // the extent is not inside one of the window's extents
};
inline constexpr uint32_t kMaxRefusal = 3;

// The code and reason a refusal completes its write with: NOT_FOUND (WINDOW_CLOSED),
// PERMISSION_DENIED (WINDOW_NOT_YOURS), OUT_OF_RANGE (OUTSIDE_WINDOW).
absl::Status RefusalStatus(Refusal refusal);

struct WriteOp {
  RegionKey local_key = 0;  // source region, registered on this node
  uint64_t local_offset = 0;
  // A window the peer opened for this node; ignored by notifications (bytes == 0).
  WindowKey remote_key = 0;
  uint64_t remote_offset = 0;  // in the window's region
  // 0 makes a notification: no bytes, only the immediate reaches the target.
  uint32_t bytes = 0;
  uint32_t imm = 0;    // delivered to the target with the arrival
  uint64_t wr_id = 0;  // returned to the source in the completion
  // Null, or device work to wait for first; must live until the write completes.
  Fence* after = nullptr;
};

// The outcome of a posted write, on the source.
struct Completion {
  uint64_t wr_id = 0;
  int nic = 0;
  uint32_t bytes = 0;
  // OK: the bytes are placed at the target. Otherwise either the target refused the
  // write (`refusal` says why; nothing was placed, the connection is fine) or the
  // transport failed (UNAVAILABLE: the bytes may or may not have landed).
  absl::Status status;
  Refusal refusal = Refusal::kNone;
};

// A write that landed here, on the target: the bytes are in place, inside a window
// that `peer` holds.
struct Arrival {
  PeerId peer = 0;
  absl::string_view peer_name;  // valid during the call
  int nic = 0;
  WindowKey window = 0;  // 0 for a notification
  uint64_t offset = 0;   // in the window's region
  uint32_t bytes = 0;
  uint32_t imm = 0;
};

// Receives the fabric's events. Called on the fabric's threads, concurrently from
// several of them; implementations must be thread-safe and must not block.
class Handler {
 public:
  virtual ~Handler() = default;
  virtual void OnCompletion(const Completion& completion) = 0;
  virtual void OnArrival(const Arrival& arrival) = 0;
  // Every connection with this peer is gone; the peer's in-flight writes have all
  // completed with an error before this is called. `name` is the peer's name (the
  // id no longer resolves by then).
  virtual void OnPeerLost(PeerId peer, absl::string_view name,
                          const absl::Status& why) = 0;
};

// Counters of one NIC, readable at any time.
struct NicCounters {
  // Payload of writes delivered: acknowledged at the source, placed at the target.
  uint64_t transmitted_bytes = 0;
  uint64_t received_bytes = 0;
  // Payload that crossed the link, whatever became of it: the delivered writes plus
  // those the target refused (their bytes were sent and read all the same). What the
  // kernel's counters hold of fuselink's traffic (agent/nicstat). Counted at the same
  // moments as the two above (the source's completion, the target's last byte read).
  uint64_t wire_tx_bytes = 0;
  uint64_t wire_rx_bytes = 0;
  uint64_t malformed_frames = 0;
  // Writes refused before placement: no window, another peer's, outside it.
  uint64_t refused_writes = 0;
  // Accepted connections closed before they proved the key agreed with the peer they
  // named (unknown peer, wrong proof, malformed, too slow).
  uint64_t auth_failures = 0;
  // Connections closed because a frame, once begun, stopped arriving (no byte for the
  // stall timeout). TCP: accepted connections (also: an acknowledgement found no
  // room); verbs: control connections, either end.
  uint64_t stalled_connections = 0;
  // Connections (TCP) or QPs (verbs) of ours closed because the writes on them went
  // unacknowledged for the acknowledgement timeout (verbs also: through the RC
  // receiver-not-ready retries); their writes failed over.
  uint64_t ack_timeouts = 0;
  // Accepted connections (TCP) or control connections (verbs) refused because their
  // peer already held its share of this node's connections.
  uint64_t peer_connection_refusals = 0;
  // Staged writes out of GPU memory that waited because their peer held its share of
  // the NIC's bounce slots, while other peers' went on (verbs only).
  uint64_t staged_share_waits = 0;
};

// Moves the bytes of GPU regions for a transport whose NICs reach only host memory (the
// TCP fabric; the stand-in for GPUDirect RDMA). Each fabric thread that sends or
// receives GPU bytes owns a stage: two pinned host buffers and the streams to fill and
// drain them, so it copies one piece while the socket carries the other. Used by one
// thread at a time.
class DeviceStage {
 public:
  virtual ~DeviceStage() = default;
  // Size of each buffer; writes move in pieces of at most this.
  virtual uint32_t piece_bytes() const = 0;
  // Pinned host buffer `i` (0 or 1).
  virtual uint8_t* buffer(int i) = 0;
  // Enqueues device `source` on `gpu` -> buffer `i`. It crosses `gpu`'s own PCIe link,
  // as a NIC reading that GPU's memory would.
  virtual absl::Status StartToHost(int gpu, uint64_t source, int i, uint32_t bytes) = 0;
  // Enqueues buffer `i` -> device `target` on `gpu`. Lands on the GPU next to this
  // stage's NIC first and crosses NVLink from there when `gpu` is another GPU.
  virtual absl::Status StartToDevice(int gpu, uint64_t target, int i, uint32_t bytes) = 0;
  // The same two copies between the GPU and pinned host memory the caller owns (from
  // DeviceStager::AllocatePinned): a verbs bounce slot or a window's host shadow.
  virtual absl::Status StartToHostAt(int gpu, uint64_t source, uint8_t* host,
                                     uint32_t bytes) = 0;
  virtual absl::Status StartToDeviceFrom(int gpu, uint64_t target, const uint8_t* host,
                                         uint32_t bytes) = 0;
  // Waits for every copy enqueued so far; the first error. Bounded (gpu/copy_bound.h):
  // DEADLINE_EXCEEDED, reason GPU_COPY_TIMEOUT, once the node's bound passes. The stage
  // is then spent (every later copy is refused FAILED_PRECONDITION), and memory of the
  // caller's that its copies touch must stay put until they end: KeepWhileBusy.
  virtual absl::Status Wait() = 0;
  // Keeps `memory` (a bounce slot, a window's shadow) while copies of this stage may
  // still touch it, past the stage's own life if need be. For memory a copy that
  // timed out may still read or write.
  virtual void KeepWhileBusy(std::shared_ptr<const void> memory) = 0;
};

// `status`, having kept `memory` on `stage` where it says that a copy timed out
// (DeviceStage::Wait's DEADLINE_EXCEEDED).
inline absl::Status KeepOnTimeout(DeviceStage& stage, std::shared_ptr<const void> memory,
                                  absl::Status status) {
  if (absl::IsDeadlineExceeded(status)) stage.KeepWhileBusy(std::move(memory));
  return status;
}

// A range of GPU memory exported as a dma-buf: `bytes` at `offset` into the buffer
// `fd` stands for (the export covers whole pages around the range).
struct DmabufRange {
  UniqueFd fd;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Makes stages; shared by the fabric's threads. Thread-safe.
class DeviceStager {
 public:
  virtual ~DeviceStager() = default;
  virtual absl::StatusOr<std::unique_ptr<DeviceStage>> NewStage(int nic) = 0;
  // Pinned host memory for NIC `nic`'s copies, freed when the last holder lets go.
  virtual absl::StatusOr<std::shared_ptr<uint8_t>> AllocatePinned(int nic,
                                                                  uint64_t bytes) = 0;
  // [address, address + bytes) on `gpu` as a dma-buf a NIC can register (GPUDirect
  // RDMA). UNIMPLEMENTED where the driver or the GPU cannot export one.
  virtual absl::StatusOr<DmabufRange> ExportDmabuf(int gpu, uint64_t address,
                                                   uint64_t bytes) {
    return absl::UnimplementedError("this stager exports no dma-buf");
  }
  // A small device allocation on `gpu` to probe a NIC's access with; its address in
  // `*address`, freed when the result is. UNIMPLEMENTED without real GPU memory.
  virtual absl::StatusOr<std::shared_ptr<const void>> AllocateProbe(int gpu,
                                                                    uint64_t bytes,
                                                                    uint64_t* address) {
    return absl::UnimplementedError("this stager has no device memory to probe with");
  }
};

class Fabric {
 public:
  virtual ~Fabric() = default;

  // "tcp" or "verbs".
  virtual absl::string_view transport() const = 0;
  virtual int nic_count() const = 0;
  // Where this node's NICs listen; sent to peers in the bootstrap.
  virtual std::vector<Endpoint> endpoints() const = 0;

  // Makes [base, base + bytes) readable by local writes and writable by peers.
  // `keepalive` owns the memory; the fabric holds it until the region is deregistered
  // and no write into it is in progress.
  virtual absl::StatusOr<RegionKey> RegisterRegion(
      void* base, uint64_t bytes, std::shared_ptr<const void> keepalive) = 0;
  // The same for device memory [address, address + bytes) on GPU `gpu`.
  // UNIMPLEMENTED for a transport that cannot reach GPU memory.
  virtual absl::StatusOr<RegionKey> RegisterDeviceRegion(
      uint64_t address, uint64_t bytes, int gpu, std::shared_ptr<const void> keepalive) {
    return absl::UnimplementedError(absl::StrCat(
        "the ", transport(), " fabric of this agent cannot reach GPU memory"));
  }
  // How this transport moves GPU `gpu`'s memory over NIC `nic`: "dma-buf",
  // "peer-memory", "staged" or "none".
  virtual std::string GpuPath(int gpu, int nic) const { return "none"; }
  // Per NIC: malformed frames, failed proofs, refused writes, stalls, ACK timeouts,
  // refused connections; and for each of `gpus` GPUs its path over each NIC
  // (fabric_stats.cc).
  void ReportStats(stats::Sink& sink, int gpus) const;
  // Writes that arrive for the key afterwards are refused as malformed.
  virtual absl::Status DeregisterRegion(RegionKey key) = 0;

  // Lets the peer called `peer_name` write into `extents` of region `region` (sorted,
  // disjoint, inside the region, 1..kMaxWindowExtents of them) until CloseWindow.
  // Any write through the key that names another peer or strays outside the extents
  // is refused (Completion::refusal) and places nothing. The window holds the region
  // alive. INVALID_ARGUMENT for bad extents, NOT_FOUND for an unknown region.
  virtual absl::StatusOr<WindowKey> OpenWindow(RegionKey region,
                                               absl::string_view peer_name,
                                               std::span<const Extent> extents) = 0;
  // Whether OpenWindow may wait: on a registration or on the peer (verbs: each
  // extent registered with each NIC, then the source's ACK of the window). A caller on
  // a thread that must not block calls it from one that may when this is true.
  virtual bool OpenWindowMayWait() const = 0;
  // No write through the window is placed once this returns, except those already
  // placing; `drained` runs once they have finished (at once when there are none,
  // else on the thread that finishes the last). Never blocks. An unknown key runs
  // `drained` at once.
  virtual void CloseWindow(WindowKey window, absl::AnyInvocable<void() &&> drained) = 0;

  // Connects NIC i here to `remote[i]` for every NIC, introducing this node by the
  // name the fabric was created with. Returns the id that PostWrite takes.
  // Connecting a peer that is already connected returns its id, after trying to
  // re-open the NICs whose connections to it failed (a NIC back from an outage).
  virtual absl::StatusOr<PeerId> Connect(absl::string_view peer_name,
                                         const std::vector<Endpoint>& remote) = 0;
  // Closes every connection with the peer; its writes in flight fail UNAVAILABLE.
  virtual void Disconnect(PeerId peer) = 0;
  // For shutdown: ends every Connect under way (CANCELLED) without waiting out its
  // timeouts, and refuses new ones. Connections already made stay up.
  virtual void CancelConnects() = 0;
  // The peer's name (given to Connect or in its HELLO), or empty once it is lost.
  virtual std::string PeerName(PeerId peer) const = 0;
  // The id of the live peer called `name`, if there is one. Never blocks.
  virtual std::optional<PeerId> FindPeer(absl::string_view name) const = 0;

  // Queues a write on one NIC. Never blocks. RESOURCE_EXHAUSTED when the NIC's
  // queue is full; UNAVAILABLE when the peer is not connected on that NIC;
  // INVALID_ARGUMENT when the local extent is outside its region.
  virtual absl::Status PostWrite(PeerId peer, int nic, const WriteOp& op) = 0;

  virtual NicCounters counters(int nic) const = 0;
};

}  // namespace fuselink::fabric
