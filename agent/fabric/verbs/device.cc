#include "agent/fabric/verbs/device.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "agent/common/ipv4_interfaces.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/verbs/wrap.h"

namespace fuselink::fabric::verbs {
namespace {

bool IsIpv4Mapped(const ibv_gid& gid) {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, kPrefix, sizeof(kPrefix)) == 0;
}

std::string PciPath(absl::string_view device, absl::string_view netdev) {
  std::error_code error;
  for (const std::string& link :
       {absl::StrCat("/sys/class/infiniband/", device, "/device"),
        absl::StrCat("/sys/class/net/", netdev, "/device")}) {
    std::filesystem::path resolved = std::filesystem::canonical(link, error);
    if (!error) return resolved.string();
    error.clear();
  }
  return "";  // soft devices (rxe over veth) have no bus device
}

// The interface that holds `address`, or empty. `gid` is the address's GID: IPv6
// addresses are compared by their bytes, since one address has many spellings.
std::string InterfaceOf(absl::string_view address, const ibv_gid& gid) {
  if (IsIpv4Mapped(gid)) {
    absl::StatusOr<std::vector<InterfaceAddress>> list = ListInterfaces();
    if (!list.ok()) return "";
    for (const InterfaceAddress& a : *list) {
      if (a.ipv4 == address) return a.name;
    }
    return "";
  }
  absl::StatusOr<std::vector<Ipv6InterfaceAddress>> list = ListIpv6Interfaces();
  if (!list.ok()) return "";
  const std::string canonical = GidToString(gid);  // inet_ntop's spelling, as listed
  for (const Ipv6InterfaceAddress& a : *list) {
    if (a.ipv6 == canonical) return a.name;
  }
  return "";
}

// /sys/devices/... of an interface's device, or empty (virtual interfaces have none).
std::string NetdevPciPath(const std::string& netdev) {
  if (netdev.empty() || netdev.find('/') != std::string::npos) return "";
  std::error_code error;
  std::filesystem::path resolved = std::filesystem::canonical(
      absl::StrCat("/sys/class/net/", netdev, "/device"), error);
  return error ? "" : resolved.string();
}

// The interface's 0-based port on its device (sysfs dev_port), or -1.
int NetdevPort(const std::string& netdev) {
  if (netdev.empty() || netdev.find('/') != std::string::npos) return -1;
  std::ifstream in(absl::StrCat("/sys/class/net/", netdev, "/dev_port"));
  int port = -1;
  if (!(in >> port) || port < 0 || port > 255) return -1;
  return port;
}

absl::StatusOr<std::vector<VerbsPort>> DescribeDevice(ibv_device* device) {
  const std::string name = ibv_get_device_name(device);
  FL_ASSIGN_OR_RETURN(Context context, OpenDevice(device));
  FL_ASSIGN_OR_RETURN(ibv_device_attr attr, QueryDevice(context.get()));
  std::vector<ibv_gid_entry> raw(kMaxGidEntries);
  FL_ASSIGN_OR_RETURN(size_t gid_count, QueryGidTable(context.get(), raw));
  std::vector<VerbsPort> ports;
  for (uint8_t port = 1; port <= attr.phys_port_cnt; ++port) {
    FL_ASSIGN_OR_RETURN(ibv_port_attr port_attr, QueryPort(context.get(), port));
    VerbsPort out{.device = name,
                  .port = port,
                  .state = port_attr.state,
                  .link_layer = port_attr.link_layer,
                  .active_mtu = port_attr.active_mtu,
                  .lid = port_attr.lid,
                  .netdev = "",
                  .pci_path = "",
                  .max_qp = attr.max_qp,
                  .max_qp_wr = attr.max_qp_wr,
                  .max_cqe = attr.max_cqe,
                  .max_sge = attr.max_sge,
                  .max_mr_size = attr.max_mr_size,
                  .max_mr = attr.max_mr,
                  .max_pd = attr.max_pd,
                  .gids = {}};
    for (size_t i = 0; i < gid_count; ++i) {
      if (raw[i].port_num != port) continue;
      char netdev[IF_NAMESIZE] = {};
      if (raw[i].ndev_ifindex != 0) if_indextoname(raw[i].ndev_ifindex, netdev);
      out.gids.push_back(GidEntry{.gid = raw[i].gid,
                                  .index = raw[i].gid_index,
                                  .port = port,
                                  .type = static_cast<ibv_gid_type>(raw[i].gid_type),
                                  .netdev = netdev});
      if (out.netdev.empty()) out.netdev = netdev;
    }
    out.pci_path = PciPath(name, out.netdev);
    ports.push_back(std::move(out));
  }
  return ports;
}

}  // namespace

absl::StatusOr<ibv_gid> Ipv4MappedGid(absl::string_view ipv4) {
  in_addr address{};
  if (inet_pton(AF_INET, std::string(ipv4).c_str(), &address) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", ipv4, "' is not a dotted-quad IPv4 address"));
  }
  ibv_gid gid{};
  gid.raw[10] = 0xff;
  gid.raw[11] = 0xff;
  std::memcpy(&gid.raw[12], &address.s_addr, 4);  // already network order
  return gid;
}

absl::StatusOr<ibv_gid> AddressGid(absl::string_view address) {
  const std::string text(address);
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return Ipv4MappedGid(address);
  in6_addr v6{};
  if (inet_pton(AF_INET6, text.c_str(), &v6) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not a numeric IPv4 or IPv6 address"));
  }
  if (IN6_IS_ADDR_LINKLOCAL(&v6)) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(
            "'", address,
            "' is an IPv6 link-local address (fe80::/10): it means something only "
            "with a scope id and is not routed between nodes; give the NIC a global "
            "or unique local (fc00::/7) address")),
        reasons::kLinkLocalAddress);
  }
  const char* unfit = IN6_IS_ADDR_MULTICAST(&v6)     ? "a multicast address"
                      : IN6_IS_ADDR_UNSPECIFIED(&v6) ? "the unspecified address"
                      : IN6_IS_ADDR_V4MAPPED(&v6)
                          ? "IPv4-mapped (give the IPv4 address itself)"
                          : nullptr;
  if (unfit != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' cannot name a NIC: it is ", unfit));
  }
  ibv_gid gid{};
  static_assert(sizeof(gid.raw) == sizeof(v6.s6_addr));
  std::memcpy(gid.raw, v6.s6_addr, sizeof(gid.raw));  // RoCE v2: the address itself
  return gid;
}

std::optional<uint32_t> ChooseRoceV2Gid(std::span<const GidEntry> entries,
                                        const ibv_gid& gid) {
  for (const GidEntry& entry : entries) {
    if (entry.type == IBV_GID_TYPE_ROCE_V2 &&
        std::memcmp(entry.gid.raw, gid.raw, sizeof(gid.raw)) == 0) {
      return entry.index;
    }
  }
  return std::nullopt;
}

std::string GidToString(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, gid.raw, text, sizeof(text));
  return text;
}

absl::StatusOr<std::vector<VerbsPort>> DiscoverPorts() {
  FL_ASSIGN_OR_RETURN(DeviceList list, DeviceList::Get());
  std::vector<VerbsPort> ports;
  size_t seen = 0;
  for (ibv_device* device : list.devices()) {
    if (++seen > kMaxDevices) break;
    absl::StatusOr<std::vector<VerbsPort>> described = DescribeDevice(device);
    if (!described.ok()) {
      return absl::Status(described.status().code(),
                          absl::StrCat("device ", ibv_get_device_name(device), ": ",
                                       described.status().message()));
    }
    for (VerbsPort& port : *described) ports.push_back(std::move(port));
  }
  return ports;
}

std::optional<size_t> ChooseIpoibPort(std::span<const VerbsPort> ports,
                                      absl::string_view pci_path, int dev_port) {
  if (pci_path.empty() || dev_port < 0) return std::nullopt;
  for (size_t i = 0; i < ports.size(); ++i) {
    const VerbsPort& port = ports[i];
    if (port.link_layer == IBV_LINK_LAYER_INFINIBAND && port.pci_path == pci_path &&
        port.port == dev_port + 1) {
      return i;
    }
  }
  return std::nullopt;
}

absl::StatusOr<NicBinding> BindAddress(absl::string_view address) {
  FL_ASSIGN_OR_RETURN(ibv_gid gid, AddressGid(address));
  FL_ASSIGN_OR_RETURN(std::vector<VerbsPort> ports, DiscoverPorts());
  std::optional<NicBinding> found;
  for (VerbsPort& port : ports) {
    std::optional<uint32_t> index = ChooseRoceV2Gid(port.gids, gid);
    if (!index.has_value() || port.link_layer != IBV_LINK_LAYER_ETHERNET) continue;
    auto entry = std::find_if(port.gids.begin(), port.gids.end(),
                              [&](const GidEntry& e) { return e.index == *index; });
    std::string netdev = entry->netdev;  // ChooseRoceV2Gid found it among port.gids
    found = NicBinding{.port = std::move(port),
                       .gid_index = *index,
                       .gid = gid,
                       .lid = 0,
                       .netdev = std::move(netdev)};
    break;
  }
  if (!found.has_value()) {
    std::string netdev = InterfaceOf(address, gid);
    if (std::optional<size_t> i =
            ChooseIpoibPort(ports, NetdevPciPath(netdev), NetdevPort(netdev))) {
      VerbsPort& port = ports[*i];
      auto first = std::find_if(port.gids.begin(), port.gids.end(),
                                [](const GidEntry& e) { return e.index == 0; });
      if (first == port.gids.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            port.device, " port ", port.port, " carries ", address, " but has no GID 0"));
      }
      const ibv_gid gid0 = first->gid;  // the port GID
      found = NicBinding{.port = std::move(port),
                         .gid_index = 0,
                         .gid = gid0,
                         .lid = 0,
                         .netdev = std::move(netdev)};
      found->lid = found->port.lid;
    }
  }
  if (!found.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "no RDMA device has a RoCE v2 GID for ", address,
        ", nor an InfiniBand port its IPoIB interface (", ports.size(), " ports seen)"));
  }
  if (found->port.state != IBV_PORT_ACTIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat(found->port.device, " port ", found->port.port, " carries ", address,
                     " but is ", ibv_port_state_str(found->port.state)));
  }
  if (found->port.link_layer == IBV_LINK_LAYER_INFINIBAND && found->lid == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(found->port.device, " port ", found->port.port, " carries ", address,
                     " but has no LID yet (is a subnet manager running?)"));
  }
  return *std::move(found);
}

bool VerbsAvailable(std::span<const std::string> addresses) {
  if (addresses.empty()) return false;
  for (const std::string& address : addresses) {
    if (!BindAddress(address).ok()) return false;
  }
  return true;
}

}  // namespace fuselink::fabric::verbs
