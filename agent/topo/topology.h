// A node's GPUs and NICs, and who owns which NIC. Discovered (discovery.h), read from
// a JSON topology file (fuselink.v1.Topology in protobuf's JSON form; source "file"),
// or built as the emulated node (source "emulated"): one GPU per NIC, each NIC on its
// own loopback address.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/common/limits.h"
#include "fuselink/v1/topology.pb.h"

namespace fuselink::topo {

using Topology = ::fuselink::v1::Topology;

// Parses and validates a topology file. Fills in each NIC's index.
absl::StatusOr<Topology> LoadTopologyFile(absl::string_view path);
absl::StatusOr<Topology> ParseTopologyJson(absl::string_view json);

// `nics` emulated NICs at 127.0.<loopback_net>.<i+1>, NIC i owned by GPU i, each at
// `rate_bytes_per_s`.
Topology EmulatedTopology(int nics, int loopback_net, uint64_t rate_bytes_per_s);

// Checks names unique, addresses IsNicAddress, rails unique, owners and direct NICs
// existing, one gpu_distance entry per GPU (or none), counts within bounds; fills NIC
// indices. INVALID_ARGUMENT (reason BAD_TOPOLOGY) otherwise.
absl::Status ValidateTopology(Topology& topology);

// Whether a NIC may be addressed as `address`: a dotted-quad IPv4 address, or an IPv6
// address other than link-local (it needs a scope id and is not routed between
// nodes), multicast, unspecified or IPv4-mapped.
bool IsNicAddress(absl::string_view address);

// The NIC `gpu` starts on: its direct_nic where discovery set one, else the NIC it
// owns (the first such NIC if several), else NIC 0.
int DirectNic(const Topology& topology, uint32_t gpu);

// A NIC's rail key (v1::Nic.rail): the discovered one, else its index.
uint32_t RailOf(const v1::Nic& nic);
// RailOf each NIC, in NIC order.
std::vector<uint32_t> Rails(const Topology& topology);

// The fabric pairs NIC i of one node with NIC i of the other, so two nodes can work
// together only with the same rail at every index. OK then; else FAILED_PRECONDITION,
// reason RAIL_MISMATCH, naming both sides' rails and what the operator does about it
// (exclude the same rail on every node, or fix the port). Pure.
absl::Status CheckRailPairing(absl::string_view remote_node,
                              const std::vector<uint32_t>& local_rails,
                              const std::vector<uint32_t>& remote_rails);

}  // namespace fuselink::topo
