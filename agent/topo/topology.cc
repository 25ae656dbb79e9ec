#include "agent/topo/topology.h"

#include <arpa/inet.h>

#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace fuselink::topo {
namespace {

absl::Status BadTopology(absl::string_view why) {
  return WithReason(absl::InvalidArgumentError(absl::StrCat("topology: ", why)),
                    reasons::kBadTopology);
}

}  // namespace

absl::StatusOr<Topology> LoadTopologyFile(absl::string_view path) {
  std::ifstream in{std::string(path)};
  if (!in) return BadTopology(absl::StrCat("cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<Topology> topology = ParseTopologyJson(text.str());
  if (topology.ok() && topology->source().empty()) topology->set_source("file");
  return topology;
}

absl::StatusOr<Topology> ParseTopologyJson(absl::string_view json) {
  Topology topology;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &topology, options);
  if (!status.ok()) return BadTopology(status.ToString());
  FL_RETURN_IF_ERROR(ValidateTopology(topology));
  return topology;
}

Topology EmulatedTopology(int nics, int loopback_net, uint64_t rate_bytes_per_s) {
  Topology topology;
  topology.set_source("emulated");
  for (int i = 0; i < nics; ++i) {
    v1::Gpu* gpu = topology.add_gpus();
    gpu->set_index(i);
    gpu->set_name("emulated");
    v1::Nic* nic = topology.add_nics();
    nic->set_name(absl::StrCat("rail", i));
    nic->set_address(absl::StrCat("127.0.", loopback_net, ".", i + 1));
    nic->set_rate_bytes_per_s(rate_bytes_per_s);
    nic->set_owner_gpu(i);
    nic->set_index(i);
  }
  return topology;
}

absl::Status ValidateTopology(Topology& topology) {
  if (topology.nics_size() == 0) return BadTopology("no NICs");
  if (topology.nics_size() > kMaxNics) {
    return BadTopology(absl::StrCat("more than ", kMaxNics, " NICs"));
  }
  if (topology.gpus_size() > kMaxGpus) {
    return BadTopology(absl::StrCat("more than ", kMaxGpus, " GPUs"));
  }
  if (topology.gpus_size() == 0) {  // a node without GPUs: one notional GPU 0
    topology.add_gpus()->set_name("none");
  }
  for (int i = 0; i < topology.gpus_size(); ++i) {
    if (topology.gpus(i).index() != static_cast<uint32_t>(i)) {
      return BadTopology("GPU indices must be 0, 1, 2, ... in order");
    }
  }
  absl::flat_hash_set<std::string> names;
  absl::flat_hash_set<uint32_t> rails;
  for (int i = 0; i < topology.nics_size(); ++i) {
    v1::Nic& nic = *topology.mutable_nics(i);
    nic.set_index(i);
    if (nic.name().empty()) return BadTopology(absl::StrCat("NIC ", i, " has no name"));
    if (!names.insert(nic.name()).second) {
      return BadTopology(absl::StrCat("NIC name '", nic.name(), "' appears twice"));
    }
    if (!IsNicAddress(nic.address())) {
      return BadTopology(absl::StrCat("NIC '", nic.name(), "' address '", nic.address(),
                                      "' is not an IPv4 or global IPv6 address"));
    }
    if (!rails.insert(RailOf(nic)).second) {
      return BadTopology(absl::StrCat("NIC '", nic.name(), "' rail ", RailOf(nic),
                                      " is another NIC's too"));
    }
    if (nic.owner_gpu() >= static_cast<uint32_t>(topology.gpus_size())) {
      return BadTopology(absl::StrCat("NIC '", nic.name(), "' owner_gpu ",
                                      nic.owner_gpu(), " does not exist"));
    }
    if (nic.port() > 65535) return BadTopology("port above 65535");
    if (nic.gpu_distance_size() != 0 && nic.gpu_distance_size() != topology.gpus_size()) {
      return BadTopology(
          absl::StrCat("NIC '", nic.name(), "' has ", nic.gpu_distance_size(),
                       " gpu_distance entries for ", topology.gpus_size(), " GPUs"));
    }
  }
  for (const v1::Gpu& gpu : topology.gpus()) {
    if (gpu.has_direct_nic() &&
        gpu.direct_nic() >= static_cast<uint32_t>(topology.nics_size())) {
      return BadTopology(absl::StrCat("GPU ", gpu.index(), " direct_nic ",
                                      gpu.direct_nic(), " does not exist"));
    }
  }
  return absl::OkStatus();
}

int DirectNic(const Topology& topology, uint32_t gpu) {
  if (gpu < static_cast<uint32_t>(topology.gpus_size()) &&
      topology.gpus(gpu).has_direct_nic()) {
    return static_cast<int>(topology.gpus(gpu).direct_nic());
  }
  for (const v1::Nic& nic : topology.nics()) {
    if (nic.owner_gpu() == gpu) return static_cast<int>(nic.index());
  }
  return 0;
}

bool IsNicAddress(absl::string_view address) {
  const std::string text(address);
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return true;
  in6_addr v6{};
  return inet_pton(AF_INET6, text.c_str(), &v6) == 1 && !IN6_IS_ADDR_LINKLOCAL(&v6) &&
         !IN6_IS_ADDR_MULTICAST(&v6) && !IN6_IS_ADDR_UNSPECIFIED(&v6) &&
         !IN6_IS_ADDR_V4MAPPED(&v6);
}

uint32_t RailOf(const v1::Nic& nic) { return nic.has_rail() ? nic.rail() : nic.index(); }

std::vector<uint32_t> Rails(const Topology& topology) {
  std::vector<uint32_t> out;
  for (const v1::Nic& nic : topology.nics()) out.push_back(RailOf(nic));
  return out;
}

absl::Status CheckRailPairing(absl::string_view remote_node,
                              const std::vector<uint32_t>& local_rails,
                              const std::vector<uint32_t>& remote_rails) {
  if (local_rails == remote_rails) return absl::OkStatus();
  std::string first_difference;
  for (size_t i = 0; i < local_rails.size() && i < remote_rails.size(); ++i) {
    if (local_rails[i] != remote_rails[i]) {
      first_difference = absl::StrCat("; NIC ", i, " is rail ", local_rails[i],
                                      " here and rail ", remote_rails[i], " there");
      break;
    }
  }
  return WithReason(
      absl::FailedPreconditionError(absl::StrCat(
          "node '", remote_node, "' has rails [", absl::StrJoin(remote_rails, ","),
          "] and this node [", absl::StrJoin(local_rails, ","), "]", first_difference,
          ": the fabric pairs NIC i with NIC i, so both need the same rails. Exclude "
          "the same rail on every node (--exclude_nics) or fix the port")),
      reasons::kRailMismatch);
}

}  // namespace fuselink::topo
