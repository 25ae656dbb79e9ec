// A node's GPUs and NICs, and who owns which NIC. Discovered (discovery.h), read from
// a JSON topology file (fuselink.v1.Topology in protobuf's JSON form; source "file"),
// or built as the emulated node (source "emulated"): one GPU per NIC, each NIC on its
// own loopback address.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "fuselink/v1/topology.pb.h"

namespace fuselink::topo {

// Bound on NICs per node; the fabric and scheduler size per-NIC arrays with it.
inline constexpr int kMaxNics = 16;
inline constexpr int kMaxGpus = 16;

using Topology = ::fuselink::v1::Topology;

// Parses and validates a topology file. Fills in each NIC's index.
absl::StatusOr<Topology> LoadTopologyFile(absl::string_view path);
absl::StatusOr<Topology> ParseTopologyJson(absl::string_view json);

// `nics` emulated NICs at 127.0.<loopback_net>.<i+1>, NIC i owned by GPU i, each at
// `rate_bytes_per_s`.
Topology EmulatedTopology(int nics, int loopback_net, uint64_t rate_bytes_per_s);

// Checks names unique, addresses IPv4, owners and direct NICs existing, one
// gpu_distance entry per GPU (or none), counts within bounds; fills NIC indices.
// INVALID_ARGUMENT (reason BAD_TOPOLOGY) otherwise.
absl::Status ValidateTopology(Topology& topology);

// The NIC `gpu` starts on: its direct_nic where discovery set one, else the NIC it
// owns (the first such NIC if several), else NIC 0.
int DirectNic(const Topology& topology, uint32_t gpu);

}  // namespace fuselink::topo
