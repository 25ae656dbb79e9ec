// owner_rx: the receiving half of owner priority. Node A's GPU 0 streams tensors to
// node B and borrows A's other NICs (B's rails are idle). `owner_delay` later node C's
// GPU 1 sends to node B's GPU 1 on its own rail, rail 1, where A's borrowed chunks
// into B arrive too. Under fuselink, B marks its NIC 1 busy for its sources once C's
// transfer is open there, and A stops borrowing toward B on rail 1 (A's NIC 1 stays
// lendable at A: its owner there is idle). The row: C's rate against its rate alone,
// C's rate on its own rail against one rail's (static's solo rate), and A's borrowed
// bytes on NIC 1 while C ran. Needs 4 nodes: A, B, C are 0, 1, 2.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "tools/bench/sched_workloads.h"

namespace fuselink::bench {

absl::StatusOr<PolicyRow> OwnerReceivesWorkload(Cluster& c, const SchedOptions& o,
                                                Sampler& sampler, RunContext& context) {
  if (c.nodes.size() < 4) {
    return absl::InvalidArgumentError("owner_rx needs --nodes=4 or more");
  }
  NodeAgent& a = c.nodes[0];
  NodeAgent& b = c.nodes[1];
  NodeAgent& owner_node = c.nodes[2];
  FL_ASSIGN_OR_RETURN(std::unique_ptr<Borrowers> borrowers, Borrowers::Create(a, b, o));
  FL_ASSIGN_OR_RETURN(const OwnerTensors owner_tensors,
                      OwnerTensors::Create(owner_node, b, o));
  // C alone, under this policy; under static that is one rail's rate.
  FL_ASSIGN_OR_RETURN(const double solo_gbps, OwnerSoloGbps(c, owner_tensors, context));
  // One rail's rate: as static measured it in this run, else as configured.
  const double rail_gbps = context.static_owner_solo_gbps > 0
                               ? context.static_owner_solo_gbps
                               : o.rail_bytes_per_s * 8 / 1e9;

  sampler.Start();
  borrowers->Start();
  absl::SleepFor(o.owner_delay);
  absl::StatusOr<TransferTimes> owner_or =
      RunToEnd(owner_node, owner_tensors.Request("owner"));
  const absl::Status borrowed = borrowers->Join();
  sampler.Stop();
  FL_RETURN_IF_ERROR(owner_or.status());
  FL_RETURN_IF_ERROR(borrowed);
  const TransferTimes& owner = *owner_or;
  if (!owner_tensors.Verified() || !borrowers->Verified()) {
    return absl::DataLossError("owner_rx: a target's bytes differ");
  }

  // A's borrowed bytes on NIC 1 (all of them into B) from C's acceptance to its end.
  double at_accept = 0, at_end = 0;
  for (const NicSample& s : sampler.samples()) {
    if (s.node != 0) continue;
    if (s.at <= owner.accepted) at_accept = s.borrowed_bytes[1];
    if (s.at <= owner.completed) at_end = s.borrowed_bytes[1];
  }
  const double owner_gbps = owner_tensors.bits() / owner.seconds() / 1e9;
  // C's bytes on its own rail, where the receiver's mark keeps A's borrowed chunks
  // off B's NIC (C borrows its other NICs too, and there B's NICs are shared).
  const double direct_gbps =
      (owner.nic_bytes.size() > 1 ? static_cast<double>(owner.nic_bytes[1]) : 0) * 8 /
      owner.seconds() / 1e9;
  PolicyRow row{Result("sched_owner_rx"), direct_gbps / rail_gbps, true};
  row.result.Add("policy", c.policy)
      .Add("owner_gbit_s", owner_gbps)
      .Add("solo_gbit_s", solo_gbps)
      .Add("pct_of_own_solo", 100 * owner_gbps / solo_gbps)
      .Add("direct_gbit_s", direct_gbps)
      .Add("direct_pct_of_rail", 100 * direct_gbps / rail_gbps)
      .Add("a_borrowed_mib_on_nic1_while_owner",
           (at_end - at_accept) / static_cast<double>(kMiB))
      .Add("verified", std::string("yes"));
  return row;
}

}  // namespace fuselink::bench
