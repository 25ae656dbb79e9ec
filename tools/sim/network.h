// A discrete-event model of a cluster's NICs driven by the agent's own scheduler
// (agent/sched: the same code, not a model of it). Each node has one sched::Scheduler
// and N NICs; NIC k of every node is on rail k, and a chunk on rail k occupies the
// sender's NIC k for its bytes at the rail's rate, then the receiver's NIC k as the
// Receiver model says (senders to one receiver queue at its switch port, not on their
// own NICs); it is acknowledged two latencies after it landed. A transfer keeps up to
// `window_chunks` chunks in flight; a chunk the scheduler has no NIC for waits for the
// next completion on its node, as in the agent's engine. The receiver's idle mask is what
// the agent's landing reports: rails on which no transfer arrives whose source's direct
// NIC is that rail.
//
// The links inside a node (LinkModel, off unless a rate is set): GPU g owns NIC g
// (GPU g of a flow is its `src_gpu % nics`, as its direct NIC). A chunk sent on a NIC
// its GPU does not own is first copied over NVLink into a relay slot on the NIC's
// owner; every chunk leaves that GPU's memory over the PCIe link to the switch it
// shares with the NIC, crosses the rail, lands over the receiver's PCIe link into the
// NIC's owner there, and is forwarded over NVLink when the target GPU is another one.
// Store and forward per chunk: each stage starts when the one before it has ended and
// its links are free, and holds each link for bytes / that link's rate; links serve
// chunks in the order they were posted. Above the switches (off unless a rate is
// set): NIC k's switch hangs off host bridge k / nics_per_bridge, NICs from
// nics_per_socket on sit on the second socket, and one link joins the two sockets. A
// tensor in host memory (Flow::src_host_socket, dst_host_socket) needs no relay: any NIC
// reads it, down through that NIC's bridge, and across the socket link when the memory is
// on the other socket. Without NVLink (relay_over_pcie) a relay copy crosses the two
// GPUs' PCIe links, their bridges when those differ, and the socket link when the
// sockets do. Not modelled: CPU, TCP's own dynamics, the copy engines' own limits.
//
// The receiver's NIC (Receiver): kFifo takes chunks one at a time in the order they
// were posted, as above. kShared splits its rate evenly between every chunk that has
// begun to arrive and not yet landed (processor sharing, as TCP shares a port between
// its flows): a chunk lands when it has had its bytes' worth, and no sooner than its
// sender sent it. The stages after it (PCIe, NVLink) then start in landing order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <queue>
#include <vector>

#include "agent/sched/scheduler.h"

namespace fuselink::sim {

// Rates of the links inside a node, each way; 0: not modelled (never a bottleneck and
// no time taken). All 0 (the default): the rails alone, the testbed's model.
struct LinkModel {
  double pcie_bytes_per_s = 0;           // GPU k <-> the switch it shares with NIC k
  double nvlink_egress_bytes_per_s = 0;  // out of one GPU
  double nvlink_ingress_bytes_per_s = 0;
  double nvlink_total_bytes_per_s = 0;  // through the node's NVLink switch, all GPUs
  double host_bridge_bytes_per_s = 0;   // a host bridge to the switches under it
  int nics_per_bridge = 1;              // switches (GPU and NIC pairs) per bridge
  double socket_bytes_per_s = 0;        // from one socket to the other
  int nics_per_socket = 0;              // 0: one socket; else NICs past it on socket 1
  bool relay_over_pcie = false;         // no NVLink: relay copies cross PCIe
};

enum class Receiver { kFifo, kShared };
inline const char* ReceiverName(Receiver r) {
  return r == Receiver::kFifo ? "fifo" : "shared";
}

struct NetworkModel {
  int nodes = 2;
  int nics = 4;                       // per node; GPU g's direct NIC is g
  double rail_bytes_per_s = 119.5e6;  // one rail, either way
  double latency_s = 100e-6;          // one way, per chunk
  uint64_t chunk_bytes = 1 << 20;
  uint32_t window_chunks = 16;
  sched::Limits limits;
  sched::Policy policy = sched::Policy::kFuselink;
  LinkModel links;
  Receiver receiver = Receiver::kShared;
  // false: sources see every receiver NIC idle (what ignoring the landing's marks,
  // the receiving half of owner priority, would give).
  bool receiver_marks = true;
};

struct Flow {
  int src_node = 0, src_gpu = 0, dst_node = 1;
  uint64_t bytes = 0;
  double start_s = 0;
  int dst_gpu = -1;  // -1: the GPU of the same index as src_gpu
  // >= 0: that end's tensor is in host memory on this socket (src_gpu still names the
  // sending GPU's engine, and so the direct NIC); -1: in the GPU's memory.
  int src_host_socket = -1, dst_host_socket = -1;
};

struct FlowResult {
  double start_s = 0, end_s = 0;
  std::vector<uint64_t> nic_bytes;  // by the NIC that carried them
  double seconds() const { return end_s - start_s; }
};

class Network {
 public:
  explicit Network(NetworkModel model);
  ~Network();

  // Runs every flow to its end, and those `on_end` adds as flows end (their index
  // follows the others'); results in flow order.
  using OnEnd = std::function<void(size_t flow, Network& network)>;
  std::vector<FlowResult> Run(const std::vector<Flow>& flows, OnEnd on_end = {});
  // From `on_end`: another flow, starting at `flow.start_s` (not before now).
  void Add(const Flow& flow);
  double now() const { return now_; }
  // Chunks simulated by the last Run.
  uint64_t chunks() const { return chunks_; }
  // NIC-seconds of the last Run in which a NIC sent nothing while a transfer on its
  // node still had chunks to place: capacity the policy left unused.
  double idle_while_demand_s() const { return idle_while_demand_s_; }

 private:
  struct Active;
  enum Kind { kStart, kAcked, kArriving, kPortDone };
  struct Event {
    double at;
    uint64_t order;  // ties in the order they were made
    Kind kind;
    size_t flow;
    sched::Choice choice;
    uint64_t bytes;           // of the chunk
    size_t port = 0;          // kPortDone: the receiver NIC (SharedPort)
    uint64_t generation = 0;  // kPortDone: stale unless the port's
    bool operator>(const Event& o) const {
      return at != o.at ? at > o.at : order > o.order;
    }
  };
  // A receiver NIC under Receiver::kShared. `served` is the service each chunk on it
  // has had since the port began, in seconds at the full rate; with n chunks it grows
  // at 1/n per second, and a chunk lands when it has grown by its bytes / rate.
  struct SharedPort {
    struct Chunk {
      double lands_at_served;
      uint64_t order;
      size_t flow;
      sched::Choice choice;
      uint64_t bytes;
      bool operator>(const Chunk& o) const {
        return lands_at_served != o.lands_at_served ? lands_at_served > o.lands_at_served
                                                    : order > o.order;
      }
    };
    double served = 0, as_of = 0;
    uint64_t generation = 0;  // bumps whenever its next landing moves
    std::priority_queue<Chunk, std::vector<Chunk>, std::greater<>> chunks;
  };
  // One link a stage holds: when it is next free, and its rate (0: not modelled).
  struct Hold {
    double* free_at;
    double bytes_per_s;
  };
  // The node's links, per GPU (= per NIC), each way.
  struct NodeLinks {
    std::vector<double> pcie_out, pcie_in, nvlink_out, nvlink_in;
    double nvlink_total = 0;
    std::vector<double> bridge_up, bridge_down;  // [bridge]: towards the host, from it
    double socket_out[2] = {0, 0};               // [socket]: towards the other one
  };
  void Start(size_t flow);
  // Posts what the flow's window and its scheduler allow now.
  void Post(size_t flow);
  void Acked(const Event& e);
  uint32_t RemoteIdle(int node) const;
  void Push(double at, Kind kind, size_t flow, sched::Choice choice = {},
            uint64_t bytes = 0);
  // The receiver's side of a chunk that has landed at `t`: its PCIe and NVLink
  // stages, then the acknowledgement.
  void Land(double t, size_t flow, sched::Choice choice, uint64_t bytes);
  // kShared: a chunk begins to arrive at its receiver's NIC, or that NIC's next chunk
  // has had its share.
  void Arriving(const Event& e);
  void PortDone(const Event& e);
  void Settle(SharedPort& port) const;
  void Reschedule(size_t port);
  // A stage of a chunk of `bytes` ready at `ready`: it starts then or when the last
  // of its modelled links is free, holds each for bytes at its rate, and ends when
  // the slowest lets the chunk go. No modelled link: it ends at `ready`.
  static double Cross(double ready, std::initializer_list<Hold> holds, uint64_t bytes);
  // A chunk of `bytes` ready at `ready` crosses a rail: it leaves the sender's NIC
  // when that is free, and the receiver's NIC takes it as it comes, or later when
  // that NIC is busy with other senders' chunks (the switch holds it meanwhile). The
  // sender's NIC is free again when it has sent it, whatever the receiver does; the
  // chunk has landed when the receiver's NIC has taken it all.
  double Rail(double ready, double* tx_free, double* rx_free, uint64_t bytes);
  // The relay copy on `node` from GPU `from` to GPU `to`, if they differ: over
  // NVLink, or over PCIe (relay_over_pcie).
  double RelayCopy(double ready, int node, int from, int to, uint64_t bytes);
  // Host memory on `socket` to NIC `nic`'s switch, and back.
  double HostToNic(double ready, int node, int socket, int nic, uint64_t bytes);
  double NicToHost(double ready, int node, int nic, int socket, uint64_t bytes);
  int BridgeOf(int nic) const { return nic / std::max(1, model_.links.nics_per_bridge); }
  int SocketOf(int nic) const;
  // The socket link from `from` to `to` when they differ (else no link).
  Hold SocketLink(NodeLinks& n, int from, int to) const;

  const NetworkModel model_;
  OnEnd on_end_;
  std::vector<std::unique_ptr<sched::Scheduler>> schedulers_;
  std::vector<std::vector<double>> tx_free_, rx_free_;  // [node][nic]: when it is free
  std::vector<NodeLinks> links_;                        // [node]: when each is free
  std::vector<SharedPort> ports_;                       // [node * nics + nic]
  std::vector<std::vector<int>> incoming_own_;          // [node][rail]
  std::vector<Active> flows_;
  std::vector<std::vector<size_t>> waiting_;  // [node]: flows that found no NIC
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  // Adds the idle NIC time of nodes with chunks to place, from now_ to `t`.
  void Advance(double t);

  std::vector<int> demand_;     // [node]: started flows with chunks not yet placed
  std::vector<int> demanding_;  // the nodes whose demand_ is not 0, in order
  double now_ = 0, idle_while_demand_s_ = 0;
  uint64_t order_ = 0, chunks_ = 0;
};

}  // namespace fuselink::sim
