#include "agent/topo/discovery.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/common/status_macros.h"
#include "agent/topo/affinity.h"

namespace fuselink::topo {
namespace {

// One port or interface that might carry data, before the choice.
struct Candidate {
  v1::ExcludedNic id;  // name, rdma device/port, netdev, pci bus id; reason if left out
  std::optional<PciPosition> position;
  std::string link_layer;
  uint64_t rate_bytes_per_s = 0;
  std::string address;
};

void Exclude(Candidate& c, absl::string_view reason, absl::string_view detail) {
  if (!c.id.reason().empty()) return;  // the first reason found stands
  c.id.set_reason(std::string(reason));
  c.id.set_detail(std::string(detail));
}

// "4: ACTIVE" -> {4, "ACTIVE"}; nullopt when malformed.
std::optional<std::pair<int, std::string>> ParseNumberedState(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, absl::MaxSplits(':', 1));
  int n = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &n)) return std::nullopt;
  return std::make_pair(n, std::string(absl::StripAsciiWhitespace(parts[1])));
}

// "400 Gb/sec (4X NDR)" -> bytes per second; 0 when malformed.
uint64_t ParseRdmaRate(absl::string_view text) {
  std::vector<absl::string_view> words = absl::StrSplit(text, ' ', absl::SkipEmpty());
  double gbit = 0;
  if (words.size() < 2 || !absl::SimpleAtod(words[0], &gbit) || gbit <= 0 ||
      !absl::StartsWith(words[1], "Gb/s")) {
    return 0;
  }
  return static_cast<uint64_t>(gbit * 1e9 / 8);
}

// "mlx5_2" before "mlx5_10": names compared by their digit runs as numbers.
bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (absl::ascii_isdigit(a[i]) && absl::ascii_isdigit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && absl::ascii_isdigit(a[ie])) ++ie;
      while (je < b.size() && absl::ascii_isdigit(b[je])) ++je;
      const std::string_view da(a.data() + i, ie - i), db(b.data() + j, je - j);
      const std::string_view ta =
          da.substr(std::min(da.find_first_not_of('0'), da.size()));
      const std::string_view tb =
          db.substr(std::min(db.find_first_not_of('0'), db.size()));
      if (ta.size() != tb.size()) return ta.size() < tb.size();
      if (ta != tb) return ta < tb;
      i = ie, j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i, ++j;
  }
  return a.size() - i < b.size() - j;
}

std::vector<std::string> NaturalList(const Sysfs& sysfs, absl::string_view path) {
  std::vector<std::string> names = sysfs.List(path);
  std::sort(names.begin(), names.end(), NaturalLess);
  return names;
}

// Every NVIDIA GPU function in sysfs, visible to this process or not.
std::vector<PciPosition> AllGpuPositions(const Sysfs& sysfs) {
  std::vector<PciPosition> out;
  for (const std::string& bdf : sysfs.List("bus/pci/devices")) {
    const std::string dir = absl::StrCat("bus/pci/devices/", bdf);
    absl::StatusOr<long long> vendor = sysfs.ReadInt(dir + "/vendor");
    absl::StatusOr<long long> klass = sysfs.ReadInt(dir + "/class");
    if (!vendor.ok() || !klass.ok() || *vendor != 0x10de) continue;
    if ((*klass >> 8) != 0x0300 && (*klass >> 8) != 0x0302) continue;
    if (absl::StatusOr<PciPosition> p = sysfs.Position(dir); p.ok()) out.push_back(*p);
  }
  return out;
}

class Discoverer {
 public:
  Discoverer(const DiscoveryOptions& options, const InterfaceAddresses& addresses)
      : options_(options), sysfs_(options.sysfs_root), addresses_(addresses) {}

  absl::StatusOr<Topology> Run();

 private:
  void AddRdmaPorts();
  void AddInterfaces();
  // The netdev of RDMA port `port` of `dev`: gid_attrs/ndevs, else the device's only
  // netdev, else the one whose dev_port is port - 1. Empty when none.
  std::string RdmaNetdev(const std::string& dev, int port) const;
  void CheckAddress(Candidate& c) const;
  bool OperatorExcluded(const Candidate& c) const;

  const DiscoveryOptions& options_;
  Sysfs sysfs_;
  const InterfaceAddresses& addresses_;
  std::vector<Candidate> candidates_;
  std::vector<std::string> notes_;
};

bool Discoverer::OperatorExcluded(const Candidate& c) const {
  for (const std::string& x : options_.exclude_nics) {
    if (x.empty()) continue;
    if (x == c.id.name() || x == c.id.rdma_device() || x == c.id.netdev()) return true;
  }
  return false;
}

void Discoverer::CheckAddress(Candidate& c) const {
  if (c.id.netdev().empty()) {
    Exclude(c, "NO_NETDEV",
            "no network interface: fuselink's connections need an IPv4 "
            "address");
    return;
  }
  auto it = addresses_.find(c.id.netdev());
  if (it == addresses_.end() || it->second.empty()) {
    Exclude(c, "NO_IPV4", absl::StrCat(c.id.netdev(), " has no IPv4 address"));
    return;
  }
  c.address = it->second.front();
}

std::string Discoverer::RdmaNetdev(const std::string& dev, int port) const {
  const std::string ndevs =
      absl::StrCat("class/infiniband/", dev, "/ports/", port, "/gid_attrs/ndevs");
  if (absl::StatusOr<std::string> n = sysfs_.Read(ndevs + "/0"); n.ok() && !n->empty()) {
    return *n;
  }
  for (const std::string& i : sysfs_.List(ndevs)) {
    if (absl::StatusOr<std::string> n = sysfs_.Read(absl::StrCat(ndevs, "/", i));
        n.ok() && !n->empty()) {
      return *n;
    }
  }
  const std::string net = absl::StrCat("class/infiniband/", dev, "/device/net");
  const std::vector<std::string> netdevs = sysfs_.List(net);
  if (netdevs.size() == 1) return netdevs[0];
  for (const std::string& n : netdevs) {
    absl::StatusOr<long long> dev_port =
        sysfs_.ReadInt(absl::StrCat(net, "/", n, "/dev_port"));
    if (dev_port.ok() && *dev_port == port - 1) return n;
  }
  return "";
}

void Discoverer::AddRdmaPorts() {
  for (const std::string& dev : NaturalList(sysfs_, "class/infiniband")) {
    const std::string dir = absl::StrCat("class/infiniband/", dev);
    absl::StatusOr<PciPosition> device_position = sysfs_.Position(dir + "/device");
    std::vector<std::string> ports = sysfs_.List(dir + "/ports");
    std::sort(ports.begin(), ports.end(), [](const std::string& a, const std::string& b) {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    });
    for (const std::string& port_name : ports) {
      int port = 0;
      Candidate c;
      c.id.set_rdma_device(dev);
      if (!absl::SimpleAtoi(port_name, &port) || port <= 0) {
        c.id.set_name(absl::StrCat(dev, "-p", port_name));
        Exclude(c, "BAD_SYSFS",
                absl::StrCat(dir, "/ports/", port_name, ": not a port number"));
        candidates_.push_back(std::move(c));
        continue;
      }
      c.id.set_rdma_port(port);
      c.id.set_name(port == 1 ? dev : absl::StrCat(dev, "-p", port));
      const std::string pdir = absl::StrCat(dir, "/ports/", port);
      c.id.set_netdev(RdmaNetdev(dev, port));
      c.position = device_position.ok() ? std::optional(*device_position) : std::nullopt;
      if (!c.position && !c.id.netdev().empty()) {  // Soft-RoCE: the netdev's position
        absl::StatusOr<PciPosition> p =
            sysfs_.Position(absl::StrCat("class/net/", c.id.netdev(), "/device"));
        if (p.ok()) c.position = *p;
      }
      if (c.position) c.id.set_pci_bus_id(c.position->function);
      c.link_layer = sysfs_.Read(pdir + "/link_layer").value_or("");
      c.rate_bytes_per_s = ParseRdmaRate(sysfs_.Read(pdir + "/rate").value_or(""));
      if (OperatorExcluded(c)) Exclude(c, "OPERATOR_EXCLUDED", "named by --exclude_nics");
      absl::StatusOr<std::string> state_text = sysfs_.Read(pdir + "/state");
      auto state = state_text.ok() ? ParseNumberedState(*state_text) : std::nullopt;
      if (!state) {
        Exclude(c, "BAD_SYSFS",
                state_text.ok()
                    ? absl::StrCat(pdir, "/state: '", *state_text, "' is not 'N: NAME'")
                    : std::string(state_text.status().message()));
      } else if (state->second != "ACTIVE") {
        const std::string phys = sysfs_.Read(pdir + "/phys_state").value_or("unknown");
        Exclude(c, "PORT_DOWN",
                absl::StrCat("port state ", *state_text, ", physical state ", phys));
      }
      candidates_.push_back(std::move(c));
    }
  }
}

void Discoverer::AddInterfaces() {
  for (const std::string& ifname : NaturalList(sysfs_, "class/net")) {
    const std::string dir = absl::StrCat("class/net/", ifname);
    // Loopback and virtual interfaces (bridges, veth, bonds' masters) have no device.
    if (ifname == "lo" || !sysfs_.Exists(dir + "/device")) continue;
    Candidate c;
    c.id.set_name(ifname);
    c.id.set_netdev(ifname);
    absl::StatusOr<PciPosition> p = sysfs_.Position(dir + "/device");
    if (p.ok()) {
      c.position = *p;
      c.id.set_pci_bus_id(p->function);
    }
    absl::StatusOr<long long> type = sysfs_.ReadInt(dir + "/type");
    c.link_layer = type.ok() && *type == 32 ? "InfiniBand" : "Ethernet";  // ARPHRD_*
    absl::StatusOr<long long> speed_mbit = sysfs_.ReadInt(dir + "/speed");
    if (speed_mbit.ok() && *speed_mbit > 0) {
      c.rate_bytes_per_s = static_cast<uint64_t>(*speed_mbit) * 1000000 / 8;
    }
    if (OperatorExcluded(c)) Exclude(c, "OPERATOR_EXCLUDED", "named by --exclude_nics");
    absl::StatusOr<long long> flags = sysfs_.ReadInt(dir + "/flags");
    const std::string operstate = sysfs_.Read(dir + "/operstate").value_or("unknown");
    if (!flags.ok()) {
      Exclude(c, "BAD_SYSFS", std::string(flags.status().message()));
    } else if ((*flags & IFF_UP) == 0 || operstate == "down") {
      Exclude(c, "NETDEV_DOWN",
              absl::StrCat(ifname, ": flags ", *flags & IFF_UP ? "up" : "down",
                           ", operstate ", operstate));
    }
    candidates_.push_back(std::move(c));
  }
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
                      "TOO_MANY_GPUS");
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
    AddRdmaPorts();
  } else {
    AddInterfaces();
  }
  DistanceMatrix distance;
  for (const Candidate& c : candidates_) {
    std::vector<PathClass> row;
    for (const PciPosition& g : gpu_positions) {
      row.push_back(c.position ? Classify(*c.position, g) : v1::PATH_CLASS_UNSPECIFIED);
    }
    distance.push_back(std::move(row));
  }
  // Management ports are judged by position among all candidates, up or down, against
  // every GPU of the machine, visible here or not: a storage or in-band port stays one
  // when the GPU-local ports are down or CUDA_VISIBLE_DEVICES hides their GPUs.
  std::vector<PciPosition> machine_gpus = gpu_positions;
  for (PciPosition& p : AllGpuPositions(sysfs_)) {
    if (std::none_of(machine_gpus.begin(), machine_gpus.end(),
                     [&](const PciPosition& g) { return g.function == p.function; })) {
      machine_gpus.push_back(std::move(p));
    }
  }
  DistanceMatrix machine_distance;
  for (const Candidate& c : candidates_) {
    std::vector<PathClass> row;
    for (const PciPosition& g : machine_gpus) {
      row.push_back(c.position ? Classify(*c.position, g) : v1::PATH_CLASS_UNSPECIFIED);
    }
    machine_distance.push_back(std::move(row));
  }
  const std::vector<bool> management = ManagementNics(machine_distance);
  for (size_t i = 0; i < candidates_.size(); ++i) {
    Candidate& c = candidates_[i];
    if (management[i]) {
      Exclude(c, "MANAGEMENT",
              "not under any GPU's PCIe switch while other NICs are (PIX or PXB to a "
              "GPU)");
    }
    CheckAddress(c);
  }

  DistanceMatrix data_distance;
  std::vector<const Candidate*> data;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    Candidate& c = candidates_[i];
    if (c.id.reason().empty() && static_cast<int>(data.size()) >= kMaxNics) {
      Exclude(c, "TOO_MANY_NICS",
              absl::StrCat("fuselink drives at most ", kMaxNics, " NICs a node"));
    }
    if (!c.id.reason().empty()) {
      *t.add_excluded_nics() = c.id;
      continue;
    }
    data.push_back(&c);
    data_distance.push_back(distance[i]);
  }
  const Affinity affinity = ChooseAffinity(data_distance, t.gpus_size());
  for (size_t n = 0; n < data.size(); ++n) {
    const Candidate& c = *data[n];
    v1::Nic* nic = t.add_nics();
    nic->set_name(c.id.name());
    nic->set_address(c.address);
    nic->set_rate_bytes_per_s(c.rate_bytes_per_s);
    nic->set_owner_gpu(affinity.owner_gpu[n]);
    nic->set_index(n);
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

absl::StatusOr<InterfaceAddresses> SystemIpv4Addresses() {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return WithReason(
        absl::UnavailableError(absl::StrCat("getifaddrs: ", std::strerror(errno))),
        "GETIFADDRS");
  }
  InterfaceAddresses out;
  for (struct ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) != nullptr) {
      out[a->ifa_name].push_back(text);
    }
  }
  freeifaddrs(list);
  return out;
}

absl::StatusOr<Topology> DiscoverTopology(const DiscoveryOptions& options) {
  InterfaceAddresses addresses;
  if (options.addresses) {
    FL_ASSIGN_OR_RETURN(addresses, options.addresses());
  } else {
    FL_ASSIGN_OR_RETURN(addresses, SystemIpv4Addresses());
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
      "NO_DATA_NIC");
}

}  // namespace fuselink::topo
