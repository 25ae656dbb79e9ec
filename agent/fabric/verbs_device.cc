#include "agent/fabric/verbs_device.h"

#include <arpa/inet.h>
#include <net/if.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/verbs_wrap.h"

namespace fuselink::fabric::verbs {
namespace {

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

absl::StatusOr<NicBinding> BindAddress(absl::string_view ipv4) {
  FL_ASSIGN_OR_RETURN(ibv_gid gid, Ipv4MappedGid(ipv4));
  FL_ASSIGN_OR_RETURN(std::vector<VerbsPort> ports, DiscoverPorts());
  for (VerbsPort& port : ports) {
    std::optional<uint32_t> index = ChooseRoceV2Gid(port.gids, gid);
    if (!index.has_value()) continue;
    if (port.link_layer != IBV_LINK_LAYER_ETHERNET) continue;
    if (port.state != IBV_PORT_ACTIVE) {
      return absl::FailedPreconditionError(absl::StrCat(port.device, " port ", port.port,
                                                        " carries ", ipv4, " but is ",
                                                        ibv_port_state_str(port.state)));
    }
    return NicBinding{.port = std::move(port), .gid_index = *index, .gid = gid};
  }
  return absl::NotFoundError(absl::StrCat("no RDMA device has a RoCE v2 GID for ", ipv4,
                                          " (", ports.size(), " ports seen)"));
}

bool VerbsAvailable(std::span<const std::string> addresses) {
  if (addresses.empty()) return false;
  for (const std::string& address : addresses) {
    if (!BindAddress(address).ok()) return false;
  }
  return true;
}

}  // namespace fuselink::fabric::verbs
