#include "agent/topo/affinity.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/match.h"

namespace fuselink::topo {

PathClass Classify(const PciPosition& a, const PciPosition& b) {
  if (a.root.empty() || b.root.empty()) return v1::PATH_CLASS_UNSPECIFIED;
  if (a.root != b.root) {
    // One NUMA node known and the other not: which side of the socket link the
    // unknown one is on is not known either.
    if ((a.numa_node < 0) != (b.numa_node < 0)) return v1::PATH_CLASS_UNSPECIFIED;
    return a.numa_node == b.numa_node ? v1::PATH_CLASS_NODE : v1::PATH_CLASS_SYS;
  }
  size_t common = 0;
  while (common < a.bridges.size() && common < b.bridges.size() &&
         a.bridges[common] == b.bridges[common]) {
    ++common;
  }
  if (common == 0) return v1::PATH_CLASS_PHB;
  // Bridges each side crosses below the common one. A switch shows in sysfs as its
  // upstream port with one downstream port per slot, so two slots of one switch are
  // each one bridge below the upstream port.
  const size_t below_a = a.bridges.size() - common;
  const size_t below_b = b.bridges.size() - common;
  return below_a <= 1 && below_b <= 1 ? v1::PATH_CLASS_PIX : v1::PATH_CLASS_PXB;
}

const char* PathClassName(PathClass c) {
  switch (c) {
    case v1::PATH_CLASS_PIX:
      return "PIX";
    case v1::PATH_CLASS_PXB:
      return "PXB";
    case v1::PATH_CLASS_PHB:
      return "PHB";
    case v1::PATH_CLASS_NODE:
      return "NODE";
    case v1::PATH_CLASS_SYS:
      return "SYS";
    default:
      return "?";
  }
}

std::optional<PathClass> ParsePathClass(absl::string_view name) {
  for (PathClass c : {v1::PATH_CLASS_PIX, v1::PATH_CLASS_PXB, v1::PATH_CLASS_PHB,
                      v1::PATH_CLASS_NODE, v1::PATH_CLASS_SYS}) {
    if (absl::EqualsIgnoreCase(name, PathClassName(c))) return c;
  }
  return std::nullopt;
}

bool GpuDirectReaches(PathClass c, PathClass limit) {
  return c == v1::PATH_CLASS_UNSPECIFIED || PathRank(c) <= PathRank(limit);
}

int PathRank(PathClass c) {
  return c == v1::PATH_CLASS_UNSPECIFIED || c > v1::PATH_CLASS_SYS
             ? v1::PATH_CLASS_SYS + 1
             : c;
}

namespace {

// Kuhn's augmenting paths over the GPU -> NIC edges of each GPU's best class: gives
// `g` a NIC, moving GPUs already matched only to other NICs of their own best class,
// so nobody's class gets worse. `seen` marks the NICs tried for this path.
bool Augment(int g, const std::vector<std::vector<int>>& best_nics,
             std::vector<int>& nic_match, std::vector<bool>& seen) {
  for (int n : best_nics[g]) {
    if (seen[n]) continue;
    seen[n] = true;
    if (nic_match[n] < 0 || Augment(nic_match[n], best_nics, nic_match, seen)) {
      nic_match[n] = g;
      return true;
    }
  }
  return false;
}

}  // namespace

Affinity ChooseAffinity(const DistanceMatrix& distance, int gpus) {
  Affinity out;
  const int nics = static_cast<int>(distance.size());
  out.owner_gpu.assign(nics, 0);
  if (gpus <= 0) return out;
  out.direct_nic.assign(gpus, 0);
  if (nics == 0) return out;

  // Each GPU's best class, and its NICs of that class in index order.
  std::vector<int> best_rank(gpus, PathRank(v1::PATH_CLASS_UNSPECIFIED));
  for (int g = 0; g < gpus; ++g) {
    for (int n = 0; n < nics; ++n) {
      best_rank[g] = std::min(best_rank[g], PathRank(distance[n][g]));
    }
  }
  std::vector<std::vector<int>> best_nics(gpus);
  for (int g = 0; g < gpus; ++g) {
    for (int n = 0; n < nics; ++n) {
      if (PathRank(distance[n][g]) == best_rank[g]) best_nics[g].push_back(n);
    }
  }
  // A maximum matching of GPUs to NICs of their best class: as many GPUs as the NICs
  // allow get a NIC of their own. GPUs join class by class, nearest first (then by
  // index), so a NIC goes to the GPU nearest it when two GPUs want it.
  std::vector<int> nic_match(nics, -1);
  for (int rank = PathRank(v1::PATH_CLASS_PIX);
       rank <= PathRank(v1::PATH_CLASS_UNSPECIFIED); ++rank) {
    for (int g = 0; g < gpus; ++g) {
      if (best_rank[g] != rank) continue;
      std::vector<bool> seen(nics, false);
      Augment(g, best_nics, nic_match, seen);
    }
  }

  // Owners: a matched NIC's GPU; the others go to their nearest GPU, ties to the GPU
  // owning fewest NICs so far, then the lowest index.
  std::vector<int> owned(gpus, 0);
  for (int n = 0; n < nics; ++n) {
    if (nic_match[n] >= 0) ++owned[nic_match[n]];
  }
  for (int n = 0; n < nics; ++n) {
    int best = nic_match[n];
    if (best < 0) {
      best = 0;
      for (int g = 1; g < gpus; ++g) {
        const int r = PathRank(distance[n][g]), rb = PathRank(distance[n][best]);
        if (r < rb || (r == rb && owned[g] < owned[best])) best = g;
      }
      ++owned[best];
    }
    out.owner_gpu[n] = best;
  }

  // Direct NICs: a matched GPU's NIC. The others (more GPUs than NICs, or NICs shared
  // by position) start on their nearest NIC; ties go to a NIC they own, then the NIC
  // fewest GPUs start on so far, then the lowest index.
  std::vector<int> starters(nics, 0);
  std::vector<int> gpu_match(gpus, -1);
  for (int n = 0; n < nics; ++n) {
    if (nic_match[n] >= 0) {
      gpu_match[nic_match[n]] = n;
      ++starters[n];
    }
  }
  for (int g = 0; g < gpus; ++g) {
    int best = gpu_match[g];
    if (best < 0) {
      auto key = [&](int n) {
        return std::make_tuple(PathRank(distance[n][g]), out.owner_gpu[n] == g ? 0 : 1,
                               starters[n], n);
      };
      best = 0;
      for (int n = 1; n < nics; ++n) {
        if (key(n) < key(best)) best = n;
      }
      ++starters[best];
    }
    out.direct_nic[g] = best;
  }
  return out;
}

std::vector<bool> ManagementNics(const DistanceMatrix& distance) {
  auto gpu_local = [](const std::vector<PathClass>& row) {
    return std::any_of(row.begin(), row.end(), [](PathClass c) {
      return c == v1::PATH_CLASS_PIX || c == v1::PATH_CLASS_PXB;
    });
  };
  const bool any_local = std::any_of(distance.begin(), distance.end(), gpu_local);
  std::vector<bool> management(distance.size(), false);
  if (!any_local) return management;
  for (size_t n = 0; n < distance.size(); ++n) {
    // A NIC whose position is unknown is not judged: nothing says it is far.
    const bool unknown =
        std::all_of(distance[n].begin(), distance[n].end(),
                    [](PathClass c) { return c == v1::PATH_CLASS_UNSPECIFIED; });
    management[n] = !unknown && !gpu_local(distance[n]);
  }
  return management;
}

}  // namespace fuselink::topo
