// The pure part of discovery: how near a GPU and a NIC are (the nvidia-smi classes),
// which GPU owns each NIC, which NIC each GPU starts on, and which NICs look like
// management ports. No I/O; docs/design.md "Topology discovery" states the rules.
#pragma once

#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "agent/topo/sysfs.h"
#include "fuselink/v1/topology.pb.h"

namespace fuselink::topo {

using PathClass = ::fuselink::v1::PathClass;

// The class of the PCIe path between two functions:
//   different host bridges (roots): NODE when both NUMA nodes are equal (or both
//     unknown: a node without NUMA information is one NUMA node), SYS when both are
//     known and differ, UNSPECIFIED when only one is known;
//   same root, no common bridge (different root ports): PHB;
//   they meet at a common bridge and each is at most one bridge below it (the two
//     downstream ports of one switch, or one port): PIX;
//   deeper below the common bridge (switches under switches): PXB.
// UNSPECIFIED also when either position is unknown (empty root).
PathClass Classify(const PciPosition& a, const PciPosition& b);

// "PIX", "PXB", "PHB", "NODE", "SYS"; "?" for UNSPECIFIED.
const char* PathClassName(PathClass c);

// Order of preference: PIX best, UNSPECIFIED worst.
int PathRank(PathClass c);

// The class named "PIX", "PXB", "PHB", "NODE" or "SYS" (any case); nullopt otherwise.
std::optional<PathClass> ParsePathClass(absl::string_view name);

// Whether a NIC should reach a GPU's memory itself (GPUDirect RDMA) at class `c`, when
// `limit` is the farthest class allowed: peer-to-peer DMA through a host bridge or
// across sockets is slower than staging through host memory on many platforms. An
// unknown class (a file or emulation that does not say) is allowed.
bool GpuDirectReaches(PathClass c, PathClass limit);

// distance[n][g]: NIC n's class to GPU g.
using DistanceMatrix = std::vector<std::vector<PathClass>>;

struct Affinity {
  std::vector<int> owner_gpu;   // per NIC
  std::vector<int> direct_nic;  // per GPU
};

// First a maximum matching of GPUs to NICs of each GPU's best class (GPUs joining
// nearest class first, then by index; a GPU already matched moves only to another NIC
// of its best class): as many GPUs as the NICs allow get a NIC of their own, at their
// best class. A matched pair is the NIC's owner and the GPU's direct NIC. Each other
// NIC is owned by its nearest GPU; ties go to the GPU that owns fewest NICs so far,
// then the lowest index. Each other GPU's direct NIC is its nearest NIC; ties go to a
// NIC it owns, then the NIC fewest GPUs start on so far, then the lowest index.
// Deterministic. With no GPUs every owner is GPU 0 (the notional GPU of a GPU-less
// node) and direct_nic is empty.
Affinity ChooseAffinity(const DistanceMatrix& distance, int gpus);

// Which NICs are management NICs: when some NIC is GPU-local (PIX or PXB to some
// GPU), every NIC of known position that is not GPU-local to any GPU. When none is
// GPU-local (a server without PCIe switches), none is: nothing tells the ports apart
// there.
std::vector<bool> ManagementNics(const DistanceMatrix& distance);

}  // namespace fuselink::topo
