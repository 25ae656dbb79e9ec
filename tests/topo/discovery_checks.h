// What the discovery tests read off a Topology, the path classes by their short names
// as nvidia-smi topo prints them, and a stand-in for the CUDA driver.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "agent/common/status_macros.h"
#include "agent/topo/affinity.h"
#include "agent/topo/discovery.h"
#include "agent/topo/gpu_probe.h"
#include "agent/topo/topology.h"
#include "tests/topo/machines.h"
#include "tests/topo/sysfs_fixture.h"

namespace fuselink::topo::testing {

inline constexpr PathClass PIX = v1::PATH_CLASS_PIX;
inline constexpr PathClass PXB = v1::PATH_CLASS_PXB;
inline constexpr PathClass PHB = v1::PATH_CLASS_PHB;
inline constexpr PathClass NODE = v1::PATH_CLASS_NODE;
inline constexpr PathClass SYS = v1::PATH_CLASS_SYS;
inline constexpr PathClass UNKNOWN = v1::PATH_CLASS_UNSPECIFIED;

inline DiscoveryOptions Options(const SysfsFixture& f, InterfaceAddresses addresses) {
  DiscoveryOptions o;
  o.sysfs_root = f.root();
  o.addresses = [addresses] { return addresses; };
  return o;
}

inline std::vector<std::string> NicNames(const Topology& t) {
  std::vector<std::string> names;
  for (const v1::Nic& n : t.nics()) names.push_back(n.name());
  return names;
}

inline std::map<std::string, std::string> Excluded(const Topology& t) {
  std::map<std::string, std::string> out;
  for (const v1::ExcludedNic& x : t.excluded_nics()) out[x.name()] = x.reason();
  return out;
}

inline std::vector<int> Owners(const Topology& t) {
  std::vector<int> out;
  for (const v1::Nic& n : t.nics()) out.push_back(n.owner_gpu());
  return out;
}

inline std::vector<int> DirectNics(const Topology& t) {
  std::vector<int> out;
  for (const v1::Gpu& g : t.gpus())
    out.push_back(g.has_direct_nic() ? g.direct_nic() : -1);
  return out;
}

inline std::vector<uint32_t> NicRails(const Topology& t) { return Rails(t); }

inline std::vector<PathClass> Row(const v1::Nic& n) {
  std::vector<PathClass> row;
  for (int g = 0; g < n.gpu_distance_size(); ++g) row.push_back(n.gpu_distance(g));
  return row;
}

// Stands in for the CUDA driver: knows UUIDs and peers, and applies
// CUDA_VISIBLE_DEVICES to its base order as the driver does.
class FakeCuda : public GpuProbe {
 public:
  FakeCuda(std::vector<ProbedGpu> base, CudaEnvironment env)
      : base_(std::move(base)), env_(std::move(env)) {}
  absl::StatusOr<GpuEnumeration> Enumerate() const override {
    GpuEnumeration out;
    FL_ASSIGN_OR_RETURN(std::vector<int> visible, SelectVisible(base_, env_, &out.notes));
    for (size_t i = 0; i < visible.size(); ++i) {
      ProbedGpu g = base_[visible[i]];
      g.ordinal = static_cast<int>(i);
      g.peers.clear();
      for (size_t j = 0; j < visible.size(); ++j) {
        if (j != i) g.peers.push_back(static_cast<int>(j));
      }
      out.gpus.push_back(std::move(g));
    }
    return out;
  }

 private:
  std::vector<ProbedGpu> base_;
  CudaEnvironment env_;
};

// The DGX fixture's eight GPUs as the driver lists them.
inline std::vector<ProbedGpu> DgxCudaGpus() {
  std::vector<ProbedGpu> gpus;
  for (int i = 0; i < 8; ++i) {
    ProbedGpu g;
    g.ordinal = i;
    g.pci_bus_id = Bdf(kDgxBus[i] + 3);
    g.uuid = absl::StrFormat("GPU-%08x-7d1f-4c2b-9a3e-0123456789ab", 0xa0 + i);
    g.name = "NVIDIA H200";
    gpus.push_back(g);
  }
  return gpus;
}

}  // namespace fuselink::topo::testing
