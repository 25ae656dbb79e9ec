// An EndpointSlice's peers (the contract: k8s_discovery.h): its addressType, the
// named port, and each endpoint's node and first address of the slice's family;
// then the peers of several slices merged, the preferred family first. Pure.
#include "services/discovery/endpoint_slices.h"

#include <arpa/inet.h>

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "services/discovery/k8s_discovery.h"

namespace fuselink::services {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using k8s_internal::ParseJson;
using k8s_internal::PeersOf;

std::optional<AddressFamily> FamilyOf(const std::string& address) {
  unsigned char bytes[sizeof(in6_addr)];
  if (inet_pton(AF_INET, address.c_str(), bytes) == 1) return AddressFamily::kIPv4;
  if (inet_pton(AF_INET6, address.c_str(), bytes) == 1) return AddressFamily::kIPv6;
  return std::nullopt;
}

// "host:port" as gRPC dials it: an IPv6 address in brackets.
std::string HostPort(const std::string& address, AddressFamily family, int port) {
  return family == AddressFamily::kIPv6 ? absl::StrCat("[", address, "]:", port)
                                        : absl::StrCat(address, ":", port);
}

}  // namespace

namespace k8s_internal {

const Value* Field(const Struct& s, absl::string_view name) {
  auto it = s.fields().find(std::string(name));
  return it == s.fields().end() ? nullptr : &it->second;
}
const Struct* Object(const Struct& s, absl::string_view name) {
  const Value* v = Field(s, name);
  return v != nullptr && v->has_struct_value() ? &v->struct_value() : nullptr;
}
std::string String(const Struct* s, absl::string_view name) {
  if (s == nullptr) return "";
  const Value* v = Field(*s, name);
  return v != nullptr && v->kind_case() == Value::kStringValue ? v->string_value() : "";
}

absl::StatusOr<Struct> ParseJson(absl::string_view json) {
  Struct out;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto status =
      google::protobuf::util::JsonStringToMessage(std::string(json), &out, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("API server JSON: ", status.ToString()));
  }
  return out;
}

SlicePeers PeersOf(const Struct& slice, absl::string_view port_name,
                   absl::string_view self) {
  // The family every address of the slice must have; none: each its own.
  std::optional<AddressFamily> slice_family;
  if (const Value* type = Field(slice, "addressType"); type != nullptr) {
    if (type->string_value() == "IPv4") {
      slice_family = AddressFamily::kIPv4;
    } else if (type->string_value() == "IPv6") {
      slice_family = AddressFamily::kIPv6;
    } else {
      return {};  // FQDN (deprecated, never the endpoint controller's) or unknown
    }
  }
  int port = 0;
  if (const Value* ports = Field(slice, "ports");
      ports != nullptr && ports->has_list_value()) {
    for (const Value& p : ports->list_value().values()) {
      if (p.has_struct_value() && String(&p.struct_value(), "name") == port_name) {
        if (const Value* n = Field(p.struct_value(), "port"); n != nullptr) {
          port = static_cast<int>(n->number_value());
        }
      }
    }
  }
  SlicePeers peers;
  const Value* endpoints = Field(slice, "endpoints");
  if (port <= 0 || port > 65535 || endpoints == nullptr || !endpoints->has_list_value()) {
    return peers;  // no agents yet, or not our port
  }
  for (const Value& e : endpoints->list_value().values()) {
    if (!e.has_struct_value()) continue;
    const Struct& endpoint = e.struct_value();
    // discovery.k8s.io/v1 names the node; v1beta1 (Kubernetes 1.20) in its topology.
    std::string node = String(&endpoint, "nodeName");
    if (node.empty())
      node = String(Object(endpoint, "topology"), "kubernetes.io/hostname");
    const Value* addresses = Field(endpoint, "addresses");
    if (node.empty() || node == self || addresses == nullptr ||
        !addresses->has_list_value() || addresses->list_value().values_size() == 0) {
      continue;
    }
    // The addresses of one endpoint are interchangeable: the first of the right family.
    for (const Value& a : addresses->list_value().values()) {
      const std::optional<AddressFamily> family = FamilyOf(a.string_value());
      if (!family.has_value() || (slice_family.has_value() && family != slice_family)) {
        continue;
      }
      PeerSet& into = *family == AddressFamily::kIPv6 ? peers.ipv6 : peers.ipv4;
      into[node] = HostPort(a.string_value(), *family, port);
      break;
    }
  }
  return peers;
}

}  // namespace k8s_internal

AddressFamily FamilyOfListen(absl::string_view listen) {
  absl::string_view host = listen.substr(0, std::min(listen.rfind(':'), listen.size()));
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  return FamilyOf(std::string(host)) == AddressFamily::kIPv6 ? AddressFamily::kIPv6
                                                             : AddressFamily::kIPv4;
}

absl::StatusOr<SlicePeers> PeersOfSlice(absl::string_view slice_json,
                                        absl::string_view port_name,
                                        absl::string_view self) {
  absl::StatusOr<Struct> slice = ParseJson(slice_json);
  if (!slice.ok()) return slice.status();
  return PeersOf(*slice, port_name, self);
}

PeerSet MergePeers(const std::map<std::string, SlicePeers>& by_slice,
                   AddressFamily prefer) {
  // insert() keeps the first: slices in name order, the preferred family's first.
  PeerSet all;
  for (const bool preferred : {true, false}) {
    const bool ipv6 = (prefer == AddressFamily::kIPv6) == preferred;
    for (const auto& [name, peers] : by_slice) {
      const PeerSet& family = ipv6 ? peers.ipv6 : peers.ipv4;
      all.insert(family.begin(), family.end());
    }
  }
  return all;
}

}  // namespace fuselink::services
