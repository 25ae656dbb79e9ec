// A discrete-event model of a cluster's NICs driven by the agent's own scheduler
// (agent/sched: the same code, not a model of it). Each node has one sched::Scheduler
// and N NICs; NIC k of every node is on rail k, and a chunk on rail k occupies the
// sender's NIC k and the receiver's NIC k for its bytes at the rail's rate, then is
// acknowledged one latency later. A transfer keeps up to `window_chunks` chunks in
// flight; a chunk the scheduler has no NIC for waits for the next completion on its
// node, as in the agent's engine. The receiver's idle mask is what the agent's landing
// reports: rails on which no transfer arrives whose source's direct NIC is that rail.
// Not modelled (yet): PCIe and NVLink (the relay stage), CPU, TCP's own dynamics.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <vector>

#include "agent/sched/scheduler.h"

namespace fuselink::sim {

struct NetworkModel {
  int nodes = 2;
  int nics = 4;                       // per node; GPU g's direct NIC is g
  double rail_bytes_per_s = 119.5e6;  // one rail, either way
  double latency_s = 100e-6;          // one way, per chunk
  uint64_t chunk_bytes = 1 << 20;
  uint32_t window_chunks = 16;
  sched::Limits limits;
  sched::Policy policy = sched::Policy::kFuselink;
};

struct Flow {
  int src_node = 0, src_gpu = 0, dst_node = 1;
  uint64_t bytes = 0;
  double start_s = 0;
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
  struct Event {
    double at;
    uint64_t order;  // ties in the order they were made
    int kind;        // 0: a flow starts, 1: a chunk is acknowledged
    size_t flow;
    sched::Choice choice;
    uint64_t bytes;  // of the chunk
    bool operator>(const Event& o) const {
      return at != o.at ? at > o.at : order > o.order;
    }
  };
  void Start(size_t flow);
  // Posts what the flow's window and its scheduler allow now.
  void Post(size_t flow);
  void Acked(const Event& e);
  uint32_t RemoteIdle(int node) const;
  void Push(double at, int kind, size_t flow, sched::Choice choice = {},
            uint64_t bytes = 0);

  const NetworkModel model_;
  OnEnd on_end_;
  std::vector<std::unique_ptr<sched::Scheduler>> schedulers_;
  std::vector<std::vector<double>> tx_free_, rx_free_;  // [node][nic]: when it is free
  std::vector<std::vector<int>> incoming_own_;          // [node][rail]
  std::vector<Active> flows_;
  std::vector<std::vector<size_t>> waiting_;  // [node]: flows that found no NIC
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  // Adds the idle NIC time of nodes with chunks to place, from now_ to `t`.
  void Advance(double t);

  std::vector<int> demand_;  // [node]: started flows with chunks not yet placed
  double now_ = 0, idle_while_demand_s_ = 0;
  uint64_t order_ = 0, chunks_ = 0;
};

}  // namespace fuselink::sim
