// The rails the Soft-RoCE VM sets up (scripts/rdma-vm.sh), read from the environment:
// each rail's two addresses ("a0,b0;a1,b1") and its two interfaces.
#pragma once

#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"

namespace fuselink::fabric::testing {

struct Rail {
  std::string a, b;            // addresses
  std::string a_veth, b_veth;  // interfaces, empty when not given
};

// "x0,y0;x1,y1" in `env` as pairs; empty when unset.
inline std::vector<std::pair<std::string, std::string>> Pairs(const char* env) {
  std::vector<std::pair<std::string, std::string>> out;
  const char* value = std::getenv(env);
  if (value == nullptr) return out;
  for (absl::string_view rail : absl::StrSplit(value, ';', absl::SkipEmpty())) {
    std::vector<std::string> ends = absl::StrSplit(rail, ',');
    if (ends.size() == 2) out.push_back({ends[0], ends[1]});
  }
  return out;
}

// The rails whose addresses `env` names (FUSELINK_RDMA_RAILS, or ..._RAILS6), with
// the interfaces of FUSELINK_RDMA_VETHS.
inline std::vector<Rail> RailsFrom(const char* env) {
  std::vector<Rail> rails;
  auto addresses = Pairs(env);
  auto veths = Pairs("FUSELINK_RDMA_VETHS");
  for (size_t i = 0; i < addresses.size(); ++i) {
    Rail rail{
        .a = addresses[i].first, .b = addresses[i].second, .a_veth = "", .b_veth = ""};
    if (i < veths.size()) std::tie(rail.a_veth, rail.b_veth) = veths[i];
    rails.push_back(rail);
  }
  return rails;
}

}  // namespace fuselink::fabric::testing
