// RDMA device discovery: which verbs device, port and GID serve a NIC given by its IPv4
// or IPv6 address. A wrong GID index is the most reported RoCE bring-up failure, so the
// GID is never a configured number: it is the RoCE v2 entry whose GID is the address's
// own (an IPv4 address's IPv4-mapped form ::ffff:a.b.c.d, an IPv6 address itself), read
// from the device's GID table (ibv_query_gid_table, which carries each entry's type
// from sysfs gid_attrs/types and its netdev from gid_attrs/ndevs).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fuselink::fabric::verbs {

// GID table entries read per device; real tables hold a few dozen.
inline constexpr size_t kMaxGidEntries = 1024;
// Devices considered; a node has a handful.
inline constexpr size_t kMaxDevices = 64;

// One GID table entry, as discovery sees it.
struct GidEntry {
  ibv_gid gid{};
  uint32_t index = 0;
  uint8_t port = 0;
  ibv_gid_type type = IBV_GID_TYPE_IB;
  std::string netdev;  // empty when the entry names none
};

// One port of one device, with what the fabric needs to use it.
struct VerbsPort {
  std::string device;  // "mlx5_0", "rxe0"
  uint8_t port = 1;
  ibv_port_state state = IBV_PORT_NOP;
  uint8_t link_layer = IBV_LINK_LAYER_UNSPECIFIED;
  ibv_mtu active_mtu = IBV_MTU_1024;
  uint16_t lid = 0;      // InfiniBand: the port's LID (0 on Ethernet)
  std::string netdev;    // the port's Ethernet interface, from its GID entries
  std::string pci_path;  // /sys/devices/... of the device, empty for soft devices
  // Device limits.
  int max_qp = 0;
  int max_qp_wr = 0;
  int max_cqe = 0;
  int max_sge = 0;
  uint64_t max_mr_size = 0;
  int max_mr = 0;              // registrations: regions, receive arenas, window extents
  int max_pd = 0;              // the NIC's own and one per peer
  std::vector<GidEntry> gids;  // this port's entries
};

// The port and GID that serve one NIC address.
struct NicBinding {
  VerbsPort port;
  uint32_t gid_index = 0;
  ibv_gid gid{};
  uint16_t lid = 0;    // InfiniBand: the port's LID
  std::string netdev;  // the interface of the GID entry (RoCE) or the IPoIB interface
};

// The IPv4-mapped GID of a dotted-quad address; INVALID_ARGUMENT for anything else.
absl::StatusOr<ibv_gid> Ipv4MappedGid(absl::string_view ipv4);
// The RoCE v2 GID of a NIC address: an IPv4 address's IPv4-mapped form, an IPv6
// address's own 16 bytes. INVALID_ARGUMENT for text that is neither, and for the IPv6
// addresses no NIC is bound by: link-local (fe80::/10: meaningful only with a scope
// id, and not routed between nodes), multicast, unspecified, and IPv4-mapped (give
// the IPv4 address instead: its socket and its GID entry are the IPv4 ones).
absl::StatusOr<ibv_gid> AddressGid(absl::string_view address);
// The RoCE v2 entry among `entries` whose GID is `gid`; pure, for tests.
std::optional<uint32_t> ChooseRoceV2Gid(std::span<const GidEntry> entries,
                                        const ibv_gid& gid);
std::string GidToString(const ibv_gid& gid);

// The InfiniBand port among `ports` behind an IPoIB interface: the port `dev_port` + 1
// of the device at `pci_path` (the interface's /sys/class/net/IF/device and dev_port).
// Pure, for tests.
std::optional<size_t> ChooseIpoibPort(std::span<const VerbsPort> ports,
                                      absl::string_view pci_path, int dev_port);

// Every port of every device; empty (not an error) when the host has none.
absl::StatusOr<std::vector<VerbsPort>> DiscoverPorts();
// The active port that serves `address` (IPv4 or IPv6, see AddressGid): an Ethernet
// port with a RoCE v2 GID for it, or the InfiniBand port behind the IPoIB interface
// that holds it (addressed by LID, GID index 0). INVALID_ARGUMENT as AddressGid,
// NOT_FOUND when no device carries the address, FAILED_PRECONDITION when its port is
// not active.
absl::StatusOr<NicBinding> BindAddress(absl::string_view address);
// True when every address binds (BindAddress succeeds for each): the agent then picks
// the verbs transport, else tcp.
bool VerbsAvailable(std::span<const std::string> addresses);

}  // namespace fuselink::fabric::verbs
