#include "agent/topo/nic_scan.h"

#include <net/if.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fuselink::topo {
namespace {

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
  return static_cast<uint64_t>(std::llround(gbit * 1e9 / 8));  // "2.5": 312.5 MB/s
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

bool OperatorExcluded(const NicCandidate& c, const std::vector<std::string>& exclude) {
  for (const std::string& x : exclude) {
    if (x.empty()) continue;
    if (x == c.id.name() || x == c.id.rdma_device() || x == c.id.netdev()) return true;
    if (std::find(c.netdevs.begin(), c.netdevs.end(), x) != c.netdevs.end()) return true;
  }
  return false;
}

}  // namespace

void ExcludeNic(NicCandidate& c, absl::string_view reason, absl::string_view detail) {
  if (!c.id.reason().empty()) return;  // the first reason found stands
  c.id.set_reason(std::string(reason));
  c.id.set_detail(std::string(detail));
}

std::vector<std::string> RdmaNetdevs(const Sysfs& sysfs, const std::string& dev, int port,
                                     int port_count) {
  std::vector<std::string> out;
  auto add = [&out](const std::string& n) {
    if (!n.empty() && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  };
  const std::string ndevs =
      absl::StrCat("class/infiniband/", dev, "/ports/", port, "/gid_attrs/ndevs");
  for (const std::string& i : NaturalList(sysfs, ndevs)) {
    // Unused GID entries read as EINVAL: not an error, no netdev.
    if (absl::StatusOr<std::string> n = sysfs.Read(absl::StrCat(ndevs, "/", i)); n.ok()) {
      add(*n);
    }
  }
  const std::string net = absl::StrCat("class/infiniband/", dev, "/device/net");
  for (const std::string& n : NaturalList(sysfs, net)) {
    absl::StatusOr<long long> dev_port =
        sysfs.ReadInt(absl::StrCat(net, "/", n, "/dev_port"));
    // A netdev of a single-port device is that port's; of a multi-port device only by
    // its dev_port (port 2 must not take port 1's address).
    if (port_count == 1 || (dev_port.ok() && *dev_port == port - 1)) add(n);
  }
  return out;
}

std::vector<std::string> NaturalList(const Sysfs& sysfs, absl::string_view path) {
  std::vector<std::string> names = sysfs.List(path);
  std::sort(names.begin(), names.end(), NaturalLess);
  return names;
}

std::vector<NicCandidate> ScanRdmaPorts(const Sysfs& sysfs,
                                        const std::vector<std::string>& exclude) {
  std::vector<NicCandidate> out;
  for (const std::string& dev : NaturalList(sysfs, "class/infiniband")) {
    const std::string dir = absl::StrCat("class/infiniband/", dev);
    absl::StatusOr<PciPosition> device_position = sysfs.Position(dir + "/device");
    std::vector<std::string> ports = sysfs.List(dir + "/ports");
    std::sort(ports.begin(), ports.end(), [](const std::string& a, const std::string& b) {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    });
    for (const std::string& port_name : ports) {
      int port = 0;
      NicCandidate c;
      c.id.set_rdma_device(dev);
      if (!absl::SimpleAtoi(port_name, &port) || port <= 0) {
        c.id.set_name(absl::StrCat(dev, "-p", port_name));
        if (OperatorExcluded(c, exclude)) {  // the operator's word comes first
          ExcludeNic(c, "OPERATOR_EXCLUDED", "named by --exclude_nics");
        }
        ExcludeNic(c, "BAD_SYSFS",
                   absl::StrCat(dir, "/ports/", port_name, ": not a port number"));
        out.push_back(std::move(c));
        continue;
      }
      c.id.set_rdma_port(port);
      c.id.set_name(port == 1 ? dev : absl::StrCat(dev, "-p", port));
      const std::string pdir = absl::StrCat(dir, "/ports/", port);
      c.netdevs = RdmaNetdevs(sysfs, dev, port, static_cast<int>(ports.size()));
      if (!c.netdevs.empty()) c.id.set_netdev(c.netdevs.front());
      c.position = device_position.ok() ? std::optional(*device_position) : std::nullopt;
      if (!c.position && !c.id.netdev().empty()) {  // Soft-RoCE: the netdev's position
        absl::StatusOr<PciPosition> p =
            sysfs.Position(absl::StrCat("class/net/", c.id.netdev(), "/device"));
        if (p.ok()) c.position = *p;
      }
      if (c.position) c.id.set_pci_bus_id(c.position->function);
      c.link_layer = sysfs.Read(pdir + "/link_layer").value_or("");
      c.rate_bytes_per_s = ParseRdmaRate(sysfs.Read(pdir + "/rate").value_or(""));
      if (OperatorExcluded(c, exclude))
        ExcludeNic(c, "OPERATOR_EXCLUDED", "named by --exclude_nics");
      absl::StatusOr<std::string> state_text = sysfs.Read(pdir + "/state");
      auto state = state_text.ok() ? ParseNumberedState(*state_text) : std::nullopt;
      if (!state) {
        ExcludeNic(c, "BAD_SYSFS",
                   state_text.ok() ? absl::StrCat(pdir, "/state: '", *state_text,
                                                  "' is not 'N: NAME'")
                                   : std::string(state_text.status().message()));
      } else if (state->second != "ACTIVE") {
        const std::string phys = sysfs.Read(pdir + "/phys_state").value_or("unknown");
        ExcludeNic(c, "PORT_DOWN",
                   absl::StrCat("port state ", *state_text, ", physical state ", phys));
      }
      out.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<NicCandidate> ScanInterfaces(const Sysfs& sysfs,
                                         const std::vector<std::string>& exclude) {
  std::vector<NicCandidate> out;
  for (const std::string& ifname : NaturalList(sysfs, "class/net")) {
    const std::string dir = absl::StrCat("class/net/", ifname);
    // Loopback and virtual interfaces (bridges, veth, bonds' masters) have no device.
    if (ifname == "lo" || !sysfs.Exists(dir + "/device")) continue;
    NicCandidate c;
    c.id.set_name(ifname);
    c.id.set_netdev(ifname);
    c.netdevs = {ifname};
    absl::StatusOr<PciPosition> p = sysfs.Position(dir + "/device");
    if (p.ok()) {
      c.position = *p;
      c.id.set_pci_bus_id(p->function);
    }
    absl::StatusOr<long long> type = sysfs.ReadInt(dir + "/type");
    c.link_layer = type.ok() && *type == 32 ? "InfiniBand" : "Ethernet";  // ARPHRD_*
    absl::StatusOr<long long> speed_mbit = sysfs.ReadInt(dir + "/speed");
    if (speed_mbit.ok() && *speed_mbit > 0) {
      c.rate_bytes_per_s = static_cast<uint64_t>(*speed_mbit) * 1000000 / 8;
    }
    if (OperatorExcluded(c, exclude))
      ExcludeNic(c, "OPERATOR_EXCLUDED", "named by --exclude_nics");
    absl::StatusOr<long long> flags = sysfs.ReadInt(dir + "/flags");
    const std::string operstate = sysfs.Read(dir + "/operstate").value_or("unknown");
    if (!flags.ok()) {
      ExcludeNic(c, "BAD_SYSFS", std::string(flags.status().message()));
    } else if ((*flags & IFF_UP) == 0 || operstate == "down") {
      ExcludeNic(c, "NETDEV_DOWN",
                 absl::StrCat(ifname, ": flags ", *flags & IFF_UP ? "up" : "down",
                              ", operstate ", operstate));
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace fuselink::topo
