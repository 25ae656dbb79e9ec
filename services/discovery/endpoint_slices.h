// Reading the API server's JSON, shared by the two files of Kubernetes discovery:
// endpoint_slices.cc (an EndpointSlice's peers; it also defines the pure functions
// k8s_discovery.h declares: FamilyOfListen, PeersOfSlice, MergePeers) and
// k8s_discovery.cc (the list and the watch, which read the same objects). Pure.
// Internal to fuselink_k8s_discovery; callers use k8s_discovery.h.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/struct.pb.h"
#include "services/discovery/k8s_discovery.h"

namespace fuselink::services::k8s_internal {

// The field `name` of an object; null when absent.
const google::protobuf::Value* Field(const google::protobuf::Struct& s,
                                     absl::string_view name);
// The field `name` when it is an object; else null.
const google::protobuf::Struct* Object(const google::protobuf::Struct& s,
                                       absl::string_view name);
// The field `name` of `s` when it is a string; else (or for a null `s`) "".
std::string String(const google::protobuf::Struct* s, absl::string_view name);

// One JSON object; INVALID_ARGUMENT when `json` is not one.
absl::StatusOr<google::protobuf::Struct> ParseJson(absl::string_view json);

// One parsed EndpointSlice's peers (PeersOfSlice, k8s_discovery.h, says which).
SlicePeers PeersOf(const google::protobuf::Struct& slice, absl::string_view port_name,
                   absl::string_view self);

}  // namespace fuselink::services::k8s_internal
