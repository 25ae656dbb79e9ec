#include "agent/topo/render.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "agent/topo/affinity.h"
#include "agent/topo/topology.h"

namespace fuselink::topo {
namespace {

std::string Rate(uint64_t bytes_per_s) {
  if (bytes_per_s == 0) return "-";
  return absl::StrFormat("%.0f Gb/s", bytes_per_s * 8 / 1e9);
}

std::string Numa(int n) { return n < 0 ? "-" : absl::StrCat(n); }

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

}  // namespace

std::string RenderTopology(const Topology& t) {
  // The first line keeps the form scripts read ("node N, transport T, ..."):
  // tests/rdma/agent_vm_checks.sh takes the transport from it.
  std::string out =
      absl::StrFormat("node %s, transport %s, %d GPUs, %d NICs, %d excluded, source %s\n",
                      OrDash(t.node()), OrDash(t.transport()), t.gpus_size(),
                      t.nics_size(), t.excluded_nics_size(), OrDash(t.source()));
  out += "\nGPUs\n";
  absl::StrAppendFormat(&out, "  %-4s %-13s %-4s %-10s %-6s %-40s %s\n", "GPU", "PCI",
                        "NUMA", "DIRECT_NIC", "PEERS", "UUID", "NAME");
  for (const v1::Gpu& g : t.gpus()) {
    const std::string direct =
        g.has_direct_nic() && g.direct_nic() < static_cast<uint32_t>(t.nics_size())
            ? t.nics(g.direct_nic()).name()
            : "-";
    absl::StrAppendFormat(&out, "  %-4u %-13s %-4s %-10s %-6s %-40s %s\n", g.index(),
                          OrDash(g.pci_bus_id()),
                          g.pci_bus_id().empty() ? "-" : Numa(g.numa_node()), direct,
                          g.peer_gpus_size() ? absl::StrJoin(g.peer_gpus(), ",") : "-",
                          OrDash(g.uuid()), OrDash(g.name()));
  }
  out += "\nNICs\n";
  // RAIL last: scripts read the columns before it (the NIC and its address).
  absl::StrAppendFormat(&out, "  %-10s %-15s %-5s %-10s %-13s %-4s %-10s %-9s %-12s %s\n",
                        "NIC", "ADDRESS", "OWNER", "NETDEV", "PCI", "NUMA", "LINK",
                        "RATE", "RDMA", "RAIL");
  for (const v1::Nic& n : t.nics()) {
    absl::StrAppendFormat(
        &out, "  %-10s %-15s %-5u %-10s %-13s %-4s %-10s %-9s %-12s %u\n", n.name(),
        n.address(), n.owner_gpu(), OrDash(n.netdev()), OrDash(n.pci_bus_id()),
        Numa(n.numa_node()), OrDash(n.link_layer()), Rate(n.rate_bytes_per_s()),
        n.rdma_device().empty() ? "-" : absl::StrCat(n.rdma_device(), "/", n.rdma_port()),
        RailOf(n));
  }
  bool any_distance = false;
  for (const v1::Nic& n : t.nics()) any_distance |= n.gpu_distance_size() > 0;
  if (any_distance) {
    out +=
        "\nGPU x NIC (PIX same switch, PXB switches, PHB host bridge, NODE same NUMA "
        "node, SYS across sockets; * owner)\n";
    absl::StrAppendFormat(&out, "  %-10s", "");
    for (const v1::Gpu& g : t.gpus())
      absl::StrAppendFormat(&out, " %-6s", absl::StrCat("GPU", g.index()));
    out += "\n";
    for (const v1::Nic& n : t.nics()) {
      absl::StrAppendFormat(&out, "  %-10s", n.name());
      for (int g = 0; g < t.gpus_size(); ++g) {
        const std::string cell =
            g < n.gpu_distance_size()
                ? absl::StrCat(PathClassName(n.gpu_distance(g)),
                               n.owner_gpu() == static_cast<uint32_t>(g) ? "*" : "")
                : "-";
        absl::StrAppendFormat(&out, " %-6s", cell);
      }
      out += "\n";
    }
  }
  bool any_path = false;
  for (const v1::Nic& n : t.nics()) any_path |= n.gpu_memory_path_size() > 0;
  if (any_path) {
    out +=
        "\nGPU memory x NIC (dma-buf, peer-memory: the NIC reaches it; staged: through "
        "host memory)\n";
    absl::StrAppendFormat(&out, "  %-10s", "");
    for (const v1::Gpu& g : t.gpus())
      absl::StrAppendFormat(&out, " %-11s", absl::StrCat("GPU", g.index()));
    out += "\n";
    for (const v1::Nic& n : t.nics()) {
      absl::StrAppendFormat(&out, "  %-10s", n.name());
      for (int g = 0; g < t.gpus_size(); ++g) {
        absl::StrAppendFormat(&out, " %-11s",
                              g < n.gpu_memory_path_size() ? n.gpu_memory_path(g) : "-");
      }
      out += "\n";
    }
  }
  if (t.excluded_nics_size() > 0) {
    out += "\nExcluded\n";
    absl::StrAppendFormat(&out, "  %-10s %-10s %-13s %-17s %s\n", "NIC", "NETDEV", "PCI",
                          "REASON", "DETAIL");
    for (const v1::ExcludedNic& x : t.excluded_nics()) {
      absl::StrAppendFormat(&out, "  %-10s %-10s %-13s %-17s %s\n", x.name(),
                            OrDash(x.netdev()), OrDash(x.pci_bus_id()), x.reason(),
                            x.detail());
    }
  }
  for (const std::string& note : t.notes()) absl::StrAppend(&out, "note: ", note, "\n");
  return out;
}

}  // namespace fuselink::topo
