// Argument checks every transport makes the same way, so that callers see the same
// codes and messages whichever transport runs.
#pragma once

#include <atomic>
#include <bitset>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "agent/common/limits.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/fabric_keys.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric {

// A set of a node's NICs, bit i: NIC i (up to kMaxWireNics).
using NicSet = std::bitset<kMaxWireNics>;

// NICs 0 .. count - 1.
inline NicSet FirstNics(size_t count) {
  NicSet nics;
  for (size_t i = 0; i < count; ++i) nics.set(i);
  return nics;
}

// What every transport's options need: a handler, keys, a valid node name, and
// 1..kMaxWireNics local NICs, nics[i] naming NIC i.
inline absl::Status CheckFabricBasics(const Handler* handler, const FabricKeys* keys,
                                      absl::string_view node_name,
                                      const std::vector<Endpoint>& nics) {
  if (handler == nullptr) return absl::InvalidArgumentError("a fabric needs a handler");
  if (keys == nullptr) return absl::InvalidArgumentError("a fabric needs keys");
  if (absl::Status name = wire::ValidateNodeName(node_name); !name.ok()) return name;
  if (nics.empty() || nics.size() > kMaxWireNics) {
    return absl::InvalidArgumentError(
        absl::StrCat("a fabric needs 1..", kMaxWireNics, " NICs"));
  }
  for (size_t i = 0; i < nics.size(); ++i) {
    if (nics[i].nic != static_cast<int>(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("nics[", i, "] names NIC ", nics[i].nic));
    }
  }
  return absl::OkStatus();
}

// Connect's `remote`: one endpoint per local NIC, remote[i] naming NIC i.
inline absl::Status CheckRemoteEndpoints(const std::vector<Endpoint>& remote,
                                         size_t nic_count) {
  if (remote.size() != nic_count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer has ", remote.size(), " endpoints, this node ", nic_count, " NICs"));
  }
  for (size_t nic = 0; nic < remote.size(); ++nic) {
    if (remote[nic].nic != static_cast<int>(nic)) {
      return absl::InvalidArgumentError(
          absl::StrCat("remote[", nic, "] names NIC ", remote[nic].nic));
    }
  }
  return absl::OkStatus();
}

// Takes one of NIC `nic`'s `limit` write slots, counted in `used`; RESOURCE_EXHAUSTED
// when all are taken. Give it back with used.fetch_sub(1) when the write completes or
// is not posted after all.
template <typename Count>
absl::Status TakeWriteSlot(std::atomic<Count>& used, Count limit, int nic) {
  Count before = used.load(std::memory_order_relaxed);
  do {
    if (before >= limit) {
      return absl::ResourceExhaustedError(
          absl::StrCat("NIC ", nic, " has ", limit, " writes outstanding"));
    }
  } while (!used.compare_exchange_weak(before, before + 1, std::memory_order_acq_rel));
  return absl::OkStatus();
}

// PostWrite's NIC and size.
inline absl::Status CheckWrite(int nic, int nic_count, const WriteOp& op,
                               uint32_t max_write_bytes) {
  if (nic < 0 || nic >= nic_count) {
    return absl::InvalidArgumentError(absl::StrCat("no NIC ", nic));
  }
  if (op.bytes > max_write_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "write of ", op.bytes, " bytes > max_write_bytes ", max_write_bytes));
  }
  return absl::OkStatus();
}

}  // namespace fuselink::fabric
