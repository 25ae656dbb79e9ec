#include "tools/sim/network.h"

#include <algorithm>

namespace fuselink::sim {

struct Network::Active {
  Flow flow;
  FlowResult result;
  uint64_t unposted = 0, unacked = 0;
  uint32_t in_flight = 0;
  uint32_t direct_in_flight = 0;  // of them, on its direct NIC (not borrowed)
  bool waiting = false;           // on its node's waiting list
};

Network::Network(NetworkModel model) : model_(model) {
  for (int n = 0; n < model_.nodes; ++n) {
    schedulers_.push_back(
        std::make_unique<sched::Scheduler>(model_.policy, model_.nics, model_.limits));
  }
  tx_free_.assign(model_.nodes, std::vector<double>(model_.nics, 0));
  rx_free_ = tx_free_;
  const std::vector<double> free(model_.nics, 0);
  const int nics_per_bridge = std::max(1, model_.links.nics_per_bridge);
  const std::vector<double> bridges((model_.nics + nics_per_bridge - 1) / nics_per_bridge,
                                    0);
  links_.assign(model_.nodes, NodeLinks{free, free, free, free, 0, bridges, bridges});
  ports_.resize(static_cast<size_t>(model_.nodes) * model_.nics);
  incoming_own_.assign(model_.nodes, std::vector<int>(model_.nics, 0));
  waiting_.resize(model_.nodes);
  demand_.assign(model_.nodes, 0);
}

void Network::Advance(double t) {
  for (int n : demanding_) {
    for (double free_at : tx_free_[n]) {
      idle_while_demand_s_ += std::max(0.0, t - std::max(now_, free_at));
    }
  }
  now_ = t;
}

Network::~Network() = default;

void Network::Push(double at, Kind kind, size_t flow, sched::Choice choice,
                   uint64_t bytes) {
  events_.push(Event{at, order_++, kind, flow, choice, bytes});
}

void Network::Settle(SharedPort& port) const {
  if (!port.chunks.empty()) {
    port.served += (now_ - port.as_of) / static_cast<double>(port.chunks.size());
  }
  port.as_of = now_;
}

void Network::Reschedule(size_t index) {
  SharedPort& port = ports_[index];
  ++port.generation;
  if (port.chunks.empty()) return;
  const double left = port.chunks.top().lands_at_served - port.served;
  Event e{port.as_of + std::max(0.0, left) * static_cast<double>(port.chunks.size()),
          order_++,
          kPortDone,
          0,
          {},
          0};
  e.port = index;
  e.generation = port.generation;
  events_.push(e);
}

void Network::Arriving(const Event& e) {
  const size_t index =
      static_cast<size_t>(flows_[e.flow].flow.dst_node) * model_.nics + e.choice.nic;
  SharedPort& port = ports_[index];
  Settle(port);
  port.chunks.push({port.served + static_cast<double>(e.bytes) / model_.rail_bytes_per_s,
                    order_++, e.flow, e.choice, e.bytes});
  Reschedule(index);
}

void Network::PortDone(const Event& e) {
  SharedPort& port = ports_[e.port];
  if (e.generation != port.generation) return;  // a chunk came or went since
  Settle(port);
  // This event was made for the first; rounding may leave `served` a hair short.
  port.served = std::max(port.served, port.chunks.top().lands_at_served);
  while (!port.chunks.empty() && port.chunks.top().lands_at_served <= port.served) {
    const SharedPort::Chunk c = port.chunks.top();
    port.chunks.pop();
    Land(now_, c.flow, c.choice, c.bytes);
  }
  Reschedule(e.port);
}

void Network::Land(double t, size_t i, sched::Choice c, uint64_t bytes) {
  const Flow& f = flows_[i].flow;
  if (f.dst_host_socket >= 0) {
    t = NicToHost(t, f.dst_node, c.nic, f.dst_host_socket, bytes);
  } else {
    const int target = (f.dst_gpu < 0 ? f.src_gpu : f.dst_gpu) % model_.nics;
    t = Cross(t, {{&links_[f.dst_node].pcie_in[c.nic], model_.links.pcie_bytes_per_s}},
              bytes);
    t = RelayCopy(t, f.dst_node, c.nic, target, bytes);
  }
  Push(t + 2 * model_.latency_s, kAcked, i, c, bytes);  // landed, and the ack back
}

double Network::Cross(double ready, std::initializer_list<Hold> holds, uint64_t bytes) {
  double begin = ready;
  for (const Hold& h : holds) {
    if (h.bytes_per_s > 0) begin = std::max(begin, *h.free_at);
  }
  double end = begin;
  for (const Hold& h : holds) {
    if (h.bytes_per_s <= 0) continue;
    *h.free_at = begin + static_cast<double>(bytes) / h.bytes_per_s;
    end = std::max(end, *h.free_at);
  }
  return end;
}

double Network::Rail(double ready, double* tx_free, double* rx_free, uint64_t bytes) {
  const double took = static_cast<double>(bytes) / model_.rail_bytes_per_s;
  const double tx_begin = std::max(ready, *tx_free);
  *tx_free = tx_begin + took;
  const double rx_begin = std::max(tx_begin, *rx_free);
  *rx_free = std::max(*tx_free, rx_begin + took);
  return *rx_free;
}

int Network::SocketOf(int nic) const {
  const int per_socket = model_.links.nics_per_socket;
  return per_socket > 0 && nic >= per_socket ? 1 : 0;
}

Network::Hold Network::SocketLink(NodeLinks& n, int from, int to) const {
  if (from == to) return {&n.socket_out[from], 0};  // a rate of 0 holds nothing
  return {&n.socket_out[from], model_.links.socket_bytes_per_s};
}

double Network::RelayCopy(double ready, int node, int from, int to, uint64_t bytes) {
  if (from == to) return ready;
  const LinkModel& l = model_.links;
  NodeLinks& n = links_[node];
  if (!l.relay_over_pcie) {
    return Cross(ready,
                 {{&n.nvlink_out[from], l.nvlink_egress_bytes_per_s},
                  {&n.nvlink_in[to], l.nvlink_ingress_bytes_per_s},
                  {&n.nvlink_total, l.nvlink_total_bytes_per_s}},
                 bytes);
  }
  // Up from one GPU and down into the other; through the host bridges only when the
  // two switches hang off different ones.
  const int up = BridgeOf(from), down = BridgeOf(to);
  const double bridge = up == down ? 0 : l.host_bridge_bytes_per_s;
  return Cross(ready,
               {{&n.pcie_out[from], l.pcie_bytes_per_s},
                {&n.bridge_up[up], bridge},
                SocketLink(n, SocketOf(from), SocketOf(to)),
                {&n.bridge_down[down], bridge},
                {&n.pcie_in[to], l.pcie_bytes_per_s}},
               bytes);
}

double Network::HostToNic(double ready, int node, int socket, int nic, uint64_t bytes) {
  NodeLinks& n = links_[node];
  return Cross(ready,
               {SocketLink(n, socket, SocketOf(nic)),
                {&n.bridge_down[BridgeOf(nic)], model_.links.host_bridge_bytes_per_s}},
               bytes);
}

double Network::NicToHost(double ready, int node, int nic, int socket, uint64_t bytes) {
  NodeLinks& n = links_[node];
  return Cross(ready,
               {{&n.bridge_up[BridgeOf(nic)], model_.links.host_bridge_bytes_per_s},
                SocketLink(n, SocketOf(nic), socket)},
               bytes);
}

uint32_t Network::RemoteIdle(int node) const {
  if (!model_.receiver_marks) return (1u << model_.nics) - 1;
  uint32_t mask = 0;
  for (int k = 0; k < model_.nics; ++k) {
    if (incoming_own_[node][k] == 0) mask |= 1u << k;
  }
  return mask;
}

void Network::Add(const Flow& flow) {
  Active a;
  a.flow = flow;
  a.flow.start_s = std::max(flow.start_s, now_);
  a.result.nic_bytes.assign(model_.nics, 0);
  a.unposted = a.unacked = (flow.bytes + model_.chunk_bytes - 1) / model_.chunk_bytes;
  flows_.push_back(std::move(a));
  Push(flows_.back().flow.start_s, kStart, flows_.size() - 1);
}

std::vector<FlowResult> Network::Run(const std::vector<Flow>& flows, OnEnd on_end) {
  flows_.clear();
  chunks_ = 0;
  now_ = 0;
  idle_while_demand_s_ = 0;
  on_end_ = std::move(on_end);
  for (const Flow& flow : flows) Add(flow);
  while (!events_.empty()) {
    const Event e = events_.top();
    events_.pop();
    Advance(e.at);
    switch (e.kind) {
      case kStart:
        Start(e.flow);
        break;
      case kAcked:
        Acked(e);
        break;
      case kArriving:
        Arriving(e);
        break;
      case kPortDone:
        PortDone(e);
        break;
    }
  }
  std::vector<FlowResult> results;
  for (const Active& a : flows_) results.push_back(a.result);
  return results;
}

void Network::Start(size_t i) {
  Active& a = flows_[i];
  a.result.start_s = now_;
  const int direct = a.flow.src_gpu % model_.nics;
  schedulers_[a.flow.src_node]->OwnerStarted(direct);
  ++incoming_own_[a.flow.dst_node][direct];
  if (a.unacked == 0) {  // nothing to move
    a.result.end_s = now_;
    schedulers_[a.flow.src_node]->OwnerStopped(direct);
    --incoming_own_[a.flow.dst_node][direct];
    if (on_end_) on_end_(i, *this);
    return;
  }
  if (demand_[a.flow.src_node]++ == 0) {
    demanding_.insert(
        std::lower_bound(demanding_.begin(), demanding_.end(), a.flow.src_node),
        a.flow.src_node);
  }
  Post(i);
}

void Network::Post(size_t i) {
  Active& a = flows_[i];
  const int src = a.flow.src_node, dst = a.flow.dst_node;
  const int direct = a.flow.src_gpu % model_.nics;
  while (a.unposted > 0 && a.in_flight < model_.window_chunks) {
    // Its chunks not yet landed: the one being placed and those after it, and those
    // in flight.
    const sched::Choice c =
        schedulers_[src]->Pick(direct, RemoteIdle(dst), ~0u,
                               static_cast<uint32_t>(a.unacked), a.direct_in_flight);
    if (!c.ok()) {
      if (!a.waiting) waiting_[src].push_back(i);
      a.waiting = true;
      return;
    }
    const uint64_t bytes = a.unposted == 1 && a.flow.bytes % model_.chunk_bytes != 0
                               ? a.flow.bytes % model_.chunk_bytes
                               : model_.chunk_bytes;
    // Its path, stage by stage: into the relay slot on the NIC's owner when the NIC
    // is borrowed, over that GPU's PCIe to the NIC (host memory: down its bridge
    // instead), the rail (Rail, or the sender's NIC and then the shared port), PCIe
    // into the receiving NIC's owner and a relay on to the target GPU, or up into host
    // memory (Land). Unmodelled links take no time.
    double t;
    if (a.flow.src_host_socket >= 0) {
      t = HostToNic(now_, src, a.flow.src_host_socket, c.nic, bytes);
    } else {
      t = RelayCopy(now_, src, direct, c.nic, bytes);
      t = Cross(t, {{&links_[src].pcie_out[c.nic], model_.links.pcie_bytes_per_s}},
                bytes);
    }
    if (model_.receiver == Receiver::kFifo) {
      Land(Rail(t, &tx_free_[src][c.nic], &rx_free_[dst][c.nic], bytes), i, c, bytes);
    } else {
      double& tx_free = tx_free_[src][c.nic];
      tx_free = std::max(t, tx_free);
      Push(tx_free, kArriving, i, c, bytes);
      tx_free += static_cast<double>(bytes) / model_.rail_bytes_per_s;
    }
    if (--a.unposted == 0 && --demand_[src] == 0) {
      demanding_.erase(std::lower_bound(demanding_.begin(), demanding_.end(), src));
    }
    ++a.in_flight;
    if (!c.borrowed) ++a.direct_in_flight;
    ++chunks_;
  }
}

void Network::Acked(const Event& e) {
  Active& a = flows_[e.flow];
  const int src = a.flow.src_node;
  schedulers_[src]->Complete(e.choice, e.bytes);
  schedulers_[src]->Refresh();
  a.result.nic_bytes[e.choice.nic] += e.bytes;
  --a.in_flight;
  if (!e.choice.borrowed) --a.direct_in_flight;
  if (--a.unacked == 0) {
    a.result.end_s = now_;
    const int direct = a.flow.src_gpu % model_.nics;
    schedulers_[src]->OwnerStopped(direct);
    --incoming_own_[a.flow.dst_node][direct];
    if (on_end_) on_end_(e.flow, *this);
  } else {
    Post(e.flow);
  }
  // A NIC came free on this node: the flows that found none try again.
  std::vector<size_t> waiting;
  waiting.swap(waiting_[src]);
  for (size_t w : waiting) {
    flows_[w].waiting = false;
    Post(w);
  }
}

}  // namespace fuselink::sim
