// A topology as text for people: the GPU list, the NIC list with owners, the GPU x NIC
// matrix in `nvidia-smi topo -m`'s classes, and the NICs left out with their reasons.
// Used by `fuselinkctl topology` and printed by the agent at start-up.
#pragma once

#include <string>

#include "agent/topo/topology.h"

namespace fuselink::topo {

std::string RenderTopology(const Topology& topology);

}  // namespace fuselink::topo
