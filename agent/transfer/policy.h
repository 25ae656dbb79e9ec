// Which NIC carries the next chunk. The seam where the borrowing scheduler plugs in:
// it sees the transfer's direct NIC and the chunks in flight on every NIC.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fuselink::transfer {

class Policy {
 public:
  virtual ~Policy() = default;
  virtual absl::string_view name() const = 0;
  // The NIC for the next chunk of a transfer whose home GPU owns `direct_nic`.
  // `in_flight[i]` counts chunks posted on NIC i and not yet completed, all
  // transfers together. Called concurrently; must not allocate or block.
  virtual int Pick(int direct_nic, std::span<const std::atomic<uint32_t>> in_flight) = 0;
};

// "static": the direct NIC only — NIC binding, as clusters run today.
// "stripe": the NIC with the fewest chunks in flight, ignoring owners.
// INVALID_ARGUMENT (reason UNKNOWN_POLICY) for other names.
absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(absl::string_view name);

}  // namespace fuselink::transfer
