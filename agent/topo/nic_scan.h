// The first half of discovery: the ports and interfaces that might carry data, read
// from sysfs, each with its PCI position, link and the reasons found so far to leave
// it out. discovery.cc then judges positions (management ports) and addresses.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "agent/topo/sysfs.h"
#include "fuselink/v1/topology.pb.h"

namespace fuselink::topo {

struct NicCandidate {
  // Name, RDMA device and port, netdev, PCI bus id; reason and detail once left out.
  // id.netdev is the first of `netdevs` until discovery picks the one with an address.
  v1::ExcludedNic id;
  // Every netdev that may carry the port, preferred first (RdmaNetdevs).
  std::vector<std::string> netdevs;
  std::optional<PciPosition> position;  // nullopt: not known
  std::string link_layer;
  uint64_t rate_bytes_per_s = 0;
  std::string address;  // filled in by discovery from the netdev's IPv4 addresses
};

// Records why `c` is left out, unless it already has a reason (the first stands).
void ExcludeNic(NicCandidate& c, absl::string_view reason, absl::string_view detail);

// Every port of every device under class/infiniband, devices in NaturalList order,
// ports by number. Left out so far: OPERATOR_EXCLUDED (`exclude` names the NIC, the
// device or the netdev), BAD_SYSFS, PORT_DOWN.
std::vector<NicCandidate> ScanRdmaPorts(const Sysfs& sysfs,
                                        const std::vector<std::string>& exclude);

// The physical interfaces under class/net (those with a device link; not lo). Left out
// so far: OPERATOR_EXCLUDED, BAD_SYSFS, NETDEV_DOWN.
std::vector<NicCandidate> ScanInterfaces(const Sysfs& sysfs,
                                         const std::vector<std::string>& exclude);

// The netdevs that may carry RDMA port `port` of `dev`, in order of preference: the
// port's gid_attrs/ndevs/* entries (GID index order; a RoCE port's VLAN or macvlan
// children appear there), then the device's device/net/* interfaces whose dev_port
// is port - 1 (IPoIB children share their parent's), all of them when the device has
// one port. Discovery takes the first with an IPv4 address. Empty when none.
std::vector<std::string> RdmaNetdevs(const Sysfs& sysfs, const std::string& dev, int port,
                                     int port_count);

// A directory's names with digit runs compared as numbers: mlx5_2 before mlx5_10.
std::vector<std::string> NaturalList(const Sysfs& sysfs, absl::string_view path);

}  // namespace fuselink::topo
