#include "agent/topo/discovery.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/common/ipv4_interfaces.h"
#include "agent/common/status_macros.h"
#include "agent/topo/affinity.h"
#include "agent/topo/nic_scan.h"

namespace fuselink::topo {
namespace {

class Discoverer {
 public:
  Discoverer(const DiscoveryOptions& options, const InterfaceAddresses& addresses)
      : options_(options), sysfs_(options.sysfs_root), addresses_(addresses) {}

  absl::StatusOr<Topology> Run();

 private:
  void CheckAddress(NicCandidate& c) const;

  const DiscoveryOptions& options_;
  Sysfs sysfs_;
  const InterfaceAddresses& addresses_;
  std::vector<NicCandidate> candidates_;
  std::vector<std::string> notes_;
};

void Discoverer::CheckAddress(NicCandidate& c) const {
  if (c.netdevs.empty()) {
    ExcludeNic(c, "NO_NETDEV",
               "no network interface: fuselink's connections need an IP address");
    return;
  }
  // The first netdev with an address: on RoCE over a VLAN or an IPoIB child the
  // address is on the child, not on the parent listed first.
  for (const std::string& netdev : c.netdevs) {
    auto it = addresses_.find(netdev);
    if (it != addresses_.end() && !it->second.empty()) {
      c.id.set_netdev(netdev);
      c.address = it->second.front();
      return;
    }
  }
  ExcludeNic(c, "NO_IPV4",
             absl::StrCat(absl::StrJoin(c.netdevs, ", "),
                          c.netdevs.size() == 1 ? " has" : " have",
                          " no IPv4 or global IPv6 address"));
}

absl::StatusOr<Topology> Discoverer::Run() {
  // GPUs, in CUDA ordinal order, each placed in the PCIe tree.
  std::unique_ptr<GpuProbe> own_probe;
  const GpuProbe* probe = options_.gpus;
  if (probe == nullptr) {
    own_probe = MakeSysfsGpuProbe(&sysfs_, options_.cuda);
    probe = own_probe.get();
  }
  FL_ASSIGN_OR_RETURN(GpuEnumeration found, probe->Enumerate());
  if (static_cast<int>(found.gpus.size()) > kMaxGpus) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          found.gpus.size(), " GPUs found, more than the ", kMaxGpus,
                          " fuselink supports; narrow CUDA_VISIBLE_DEVICES")),
                      reasons::kTooManyGpus);
  }
  notes_ = std::move(found.notes);
  Topology t;
  t.set_source("discovered");
  std::vector<PciPosition> gpu_positions;
  for (const ProbedGpu& g : found.gpus) {
    v1::Gpu* gpu = t.add_gpus();
    gpu->set_index(t.gpus_size() - 1);
    gpu->set_name(g.name.empty() ? g.pci_bus_id : g.name);
    gpu->set_pci_bus_id(g.pci_bus_id);
    gpu->set_uuid(g.uuid);
    for (int peer : g.peers) gpu->add_peer_gpus(peer);
    absl::StatusOr<PciPosition> p =
        sysfs_.Position(absl::StrCat("bus/pci/devices/", g.pci_bus_id));
    if (!p.ok()) {
      notes_.push_back(absl::StrCat("GPU ", gpu->index(), " (", g.pci_bus_id,
                                    ") is not in sysfs: ", p.status().message()));
      gpu_positions.emplace_back();
    } else {
      gpu_positions.push_back(*p);
    }
    gpu->set_numa_node(gpu_positions.back().numa_node);
  }

  // Candidates: RDMA ports where there are RDMA devices, else physical interfaces.
  if (!sysfs_.List("class/infiniband").empty()) {
    candidates_ = ScanRdmaPorts(sysfs_, options_.exclude_nics);
  } else {
    candidates_ = ScanInterfaces(sysfs_, options_.exclude_nics);
  }
  // One matrix over every GPU of the machine, the visible ones first: the visible
  // columns are the topology's classes; all of them judge management ports, by
  // position among all candidates, up or down, so that a storage or in-band port stays
  // one when the GPU-local ports are down or CUDA_VISIBLE_DEVICES hides their GPUs.
  std::vector<PciPosition> machine_gpus = gpu_positions;
  for (const std::string& bdf : NvidiaGpuFunctions(sysfs_)) {
    absl::StatusOr<PciPosition> p =
        sysfs_.Position(absl::StrCat("bus/pci/devices/", bdf));
    if (!p.ok()) continue;
    if (std::none_of(machine_gpus.begin(), machine_gpus.end(),
                     [&](const PciPosition& g) { return g.function == p->function; })) {
      machine_gpus.push_back(*std::move(p));
    }
  }
  DistanceMatrix machine_distance;
  for (const NicCandidate& c : candidates_) {
    std::vector<PathClass> row;
    for (const PciPosition& g : machine_gpus) {
      row.push_back(c.position ? Classify(*c.position, g) : v1::PATH_CLASS_UNSPECIFIED);
    }
    machine_distance.push_back(std::move(row));
  }
  const std::vector<bool> management = ManagementNics(machine_distance);
  // Rails are numbered here, before any exclusion but management (which depends on
  // the machine alone), so that a port down on one node does not renumber its other
  // rails against the nodes where it is up.
  std::vector<uint32_t> rail(candidates_.size(), 0);
  for (size_t i = 0, next = 0; i < candidates_.size(); ++i) {
    if (!management[i]) rail[i] = static_cast<uint32_t>(next++);
  }
  for (size_t i = 0; i < candidates_.size(); ++i) {
    NicCandidate& c = candidates_[i];
    if (management[i]) {
      ExcludeNic(c, "MANAGEMENT",
                 "not under any GPU's PCIe switch while other NICs are (PIX or PXB to a "
                 "GPU)");
    }
    CheckAddress(c);
  }

  DistanceMatrix data_distance;
  std::vector<const NicCandidate*> data;
  std::vector<uint32_t> data_rail;
  absl::flat_hash_map<std::string, std::string> address_owner;  // address -> NIC
  for (size_t i = 0; i < candidates_.size(); ++i) {
    NicCandidate& c = candidates_[i];
    // Two NICs on one address would be one endpoint twice: the second rail's
    // connections would land on the first NIC. The first in order keeps it.
    if (c.id.reason().empty()) {
      auto [it, fresh] = address_owner.emplace(c.address, c.id.name());
      if (!fresh) {
        ExcludeNic(c, "DUPLICATE_ADDRESS",
                   absl::StrCat(c.id.netdev(), "'s address ", c.address, " is ",
                                it->second, "'s too"));
      }
    }
    if (c.id.reason().empty() && static_cast<int>(data.size()) >= kMaxNics) {
      ExcludeNic(c, "TOO_MANY_NICS",
                 absl::StrCat("fuselink drives at most ", kMaxNics, " NICs a node"));
    }
    if (!c.id.reason().empty()) {
      *t.add_excluded_nics() = c.id;
      continue;
    }
    data.push_back(&c);
    data_distance.emplace_back(machine_distance[i].begin(),
                               machine_distance[i].begin() + gpu_positions.size());
    data_rail.push_back(rail[i]);
  }
  const Affinity affinity = ChooseAffinity(data_distance, t.gpus_size());
  for (size_t n = 0; n < data.size(); ++n) {
    const NicCandidate& c = *data[n];
    v1::Nic* nic = t.add_nics();
    nic->set_name(c.id.name());
    nic->set_address(c.address);
    nic->set_rate_bytes_per_s(c.rate_bytes_per_s);
    nic->set_owner_gpu(affinity.owner_gpu[n]);
    nic->set_index(n);
    nic->set_rail(data_rail[n]);
    nic->set_rdma_device(c.id.rdma_device());
    nic->set_rdma_port(c.id.rdma_port());
    nic->set_link_layer(c.link_layer);
    nic->set_netdev(c.id.netdev());
    nic->set_pci_bus_id(c.id.pci_bus_id());
    nic->set_numa_node(c.position ? c.position->numa_node : -1);
    for (PathClass d : data_distance[n]) nic->add_gpu_distance(d);
  }
  for (int g = 0; g < t.gpus_size() && !data.empty(); ++g) {
    t.mutable_gpus(g)->set_direct_nic(affinity.direct_nic[g]);
  }
  for (std::string& note : notes_) t.add_notes(std::move(note));
  return t;
}

}  // namespace

absl::StatusOr<InterfaceAddresses> SystemAddresses() {
  FL_ASSIGN_OR_RETURN(std::vector<InterfaceAddress> v4, ListInterfaces());
  FL_ASSIGN_OR_RETURN(std::vector<Ipv6InterfaceAddress> v6, ListIpv6Interfaces());
  InterfaceAddresses out;
  for (InterfaceAddress& a : v4) out[a.name].push_back(std::move(a.ipv4));
  for (Ipv6InterfaceAddress& a : v6) {
    if (!a.loopback && IsNicAddress(a.ipv6)) out[a.name].push_back(std::move(a.ipv6));
  }
  return out;
}

absl::StatusOr<Topology> DiscoverTopology(const DiscoveryOptions& options) {
  InterfaceAddresses addresses;
  if (options.addresses) {
    FL_ASSIGN_OR_RETURN(addresses, options.addresses());
  } else {
    FL_ASSIGN_OR_RETURN(addresses, SystemAddresses());
  }
  return Discoverer(options, addresses).Run();
}

absl::Status RequireDataNics(const Topology& discovered) {
  if (discovered.nics_size() > 0) return absl::OkStatus();
  std::string why;
  for (const v1::ExcludedNic& x : discovered.excluded_nics()) {
    absl::StrAppend(&why, why.empty() ? "" : "; ", x.name(), ": ", x.reason(), " (",
                    x.detail(), ")");
  }
  if (why.empty()) {
    why =
        "no RDMA port (class/infiniband) and no physical network interface "
        "(class/net/*/device) found";
  }
  return WithReason(
      absl::FailedPreconditionError(
          absl::StrCat("topology discovery found no NIC that can carry data: ", why,
                       ". Fix the NICs, change --exclude_nics, or give --topology=FILE")),
      reasons::kNoDataNic);
}

NodeDiscovery::NodeDiscovery(std::string sysfs_root,
                             std::vector<std::string> exclude_nics, bool cuda_allowed)
    : sysfs_(sysfs_root) {
  options_.sysfs_root = std::move(sysfs_root);
  options_.exclude_nics = std::move(exclude_nics);
  options_.cuda = CudaEnvironment::FromProcess();
  probe_ = MakeGpuProbe(&sysfs_, options_.cuda, cuda_allowed);
  options_.gpus = probe_.get();
}

}  // namespace fuselink::topo
