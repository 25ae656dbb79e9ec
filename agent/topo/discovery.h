// Topology discovery: a node's GPUs (CUDA, or sysfs), its RDMA ports (sysfs
// class/infiniband) or, on a node without RDMA devices, its physical network
// interfaces (class/net), the PCIe tree and NUMA nodes between them (the resolved
// bus/pci/devices paths), every GPU-NIC pair's class, each NIC's owner GPU and each
// GPU's direct NIC, and the NICs left out with their reasons. The rules are in
// affinity.h and docs/design.md "Topology discovery".
//
// Reads a sysfs tree rooted anywhere (tests pass a fixture directory) and interface
// addresses from an injectable lookup, so every input can be faked. Thread-compatible;
// no state outlives a call.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "agent/topo/gpu_probe.h"
#include "agent/topo/sysfs.h"
#include "agent/topo/topology.h"

namespace fuselink::topo {

// netdev name -> its addresses, the preferred first.
using InterfaceAddresses = absl::flat_hash_map<std::string, std::vector<std::string>>;

// This host's addresses by interface (getifaddrs): IPv4 first (primary first), then
// the IPv6 ones a NIC may have (IsNicAddress: no link-local), so a netdev without IPv4
// is found by its global IPv6 address. UNAVAILABLE when getifaddrs fails.
absl::StatusOr<InterfaceAddresses> SystemAddresses();

struct DiscoveryOptions {
  std::string sysfs_root = "/sys";
  // Left out as OPERATOR_EXCLUDED: matched against the NIC's name, its RDMA device
  // and its netdev (--exclude_nics=mlx5_4,mlx5_5 or =eth0).
  std::vector<std::string> exclude_nics;
  // Where GPUs come from. Null: the sysfs probe of sysfs_root under `cuda`.
  const GpuProbe* gpus = nullptr;
  CudaEnvironment cuda;
  // Interface addresses. Null: SystemAddresses.
  std::function<absl::StatusOr<InterfaceAddresses>()> addresses;
};

// The node as found, source "discovered". Its NICs are the data NICs (possibly none:
// see RequireDataNics); it passes ValidateTopology when it has any. Errors only when
// an input cannot be read at all (the GPU probe fails, CUDA_VISIBLE_DEVICES names a
// MIG instance, getifaddrs fails); a malformed or missing sysfs attribute makes that
// NIC an exclusion (BAD_SYSFS) or that field unknown, never an error.
absl::StatusOr<Topology> DiscoverTopology(const DiscoveryOptions& options);

// This process's node, as the agent and `fuselinkctl topology` discover it: the tree
// at `sysfs_root`, GPUs from the CUDA driver where that tree is /sys and `cuda_allowed`
// (else from sysfs), under this process's CUDA_VISIBLE_DEVICES. Run may be called
// again (the timing repeats).
class NodeDiscovery {
 public:
  NodeDiscovery(std::string sysfs_root, std::vector<std::string> exclude_nics,
                bool cuda_allowed);
  NodeDiscovery(const NodeDiscovery&) = delete;  // the probe points at sysfs_
  NodeDiscovery& operator=(const NodeDiscovery&) = delete;
  absl::StatusOr<Topology> Run() const { return DiscoverTopology(options_); }
  const std::string& sysfs_root() const { return options_.sysfs_root; }

 private:
  Sysfs sysfs_;
  std::unique_ptr<GpuProbe> probe_;
  DiscoveryOptions options_;
};

// OK when `discovered` has a data NIC; else FAILED_PRECONDITION, reason NO_DATA_NIC,
// naming every excluded NIC and its reason (or saying that none was found).
absl::Status RequireDataNics(const Topology& discovered);

}  // namespace fuselink::topo
