// The fabric: one-sided writes from a local region into a peer's registered region,
// over the node's NICs. Shaped after RDMA WRITE WITH IMMEDIATE so that a verbs
// transport and the TCP transport serve the same callers:
//  - the target registers memory and hands its region key to the source (out of band,
//    through the peer bootstrap);
//  - the source posts a write (local extent -> remote key + offset, with a 32-bit
//    immediate) on a NIC; the target places the bytes, bounds-checked against the
//    region, and is told of the arrival with the immediate; the source's completion
//    fires once the target has placed them.
// NIC i of one node talks to NIC i of every peer (one rail per NIC index).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fuselink::fabric {

// Names a registered region on its own node. 0 is never a valid key.
using RegionKey = uint32_t;
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
// fences; a transport that registers none (verbs) refuses fenced writes.
class Fence {
 public:
  virtual ~Fence() = default;
  virtual absl::Status Wait() = 0;
};

struct WriteOp {
  RegionKey local_key = 0;  // source region, registered on this node
  uint64_t local_offset = 0;
  RegionKey remote_key = 0;  // target region, registered on the peer
  uint64_t remote_offset = 0;
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
  absl::Status status;  // OK: the bytes are placed at the target
};

// A write that landed here, on the target: the bytes are in place.
struct Arrival {
  PeerId peer = 0;
  int nic = 0;
  RegionKey key = 0;
  uint64_t offset = 0;
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
  uint64_t transmitted_bytes = 0;
  uint64_t received_bytes = 0;
  uint64_t malformed_frames = 0;
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
  // Waits for every copy enqueued so far; the first error.
  virtual absl::Status Wait() = 0;
};

// Makes stages; shared by the fabric's threads. Thread-safe.
class DeviceStager {
 public:
  virtual ~DeviceStager() = default;
  virtual absl::StatusOr<std::unique_ptr<DeviceStage>> NewStage(int nic) = 0;
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
  // Writes that arrive for the key afterwards are refused as malformed.
  virtual absl::Status DeregisterRegion(RegionKey key) = 0;

  // Connects NIC i here to `remote[i]` for every NIC, introducing this node by the
  // name the fabric was created with. Returns the id that PostWrite takes.
  // Connecting a peer that is already connected returns its id, after trying to
  // re-open the NICs whose connections to it failed (a NIC back from an outage).
  virtual absl::StatusOr<PeerId> Connect(absl::string_view peer_name,
                                         const std::vector<Endpoint>& remote) = 0;
  // Closes every connection with the peer; its writes in flight fail UNAVAILABLE.
  virtual void Disconnect(PeerId peer) = 0;
  // The peer's name (given to Connect or in its HELLO), or empty once it is lost.
  virtual std::string PeerName(PeerId peer) const = 0;

  // Queues a write on one NIC. Never blocks. RESOURCE_EXHAUSTED when the NIC's
  // queue is full; UNAVAILABLE when the peer is not connected on that NIC;
  // INVALID_ARGUMENT when the local extent is outside its region.
  virtual absl::Status PostWrite(PeerId peer, int nic, const WriteOp& op) = 0;

  virtual NicCounters counters(int nic) const = 0;
};

}  // namespace fuselink::fabric
