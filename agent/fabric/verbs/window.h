// Windows as a verbs source sees them: for each window a target opened for this node,
// the target's registration (rkey) of every extent on one NIC. Pure: no verbs calls.
//
// The target registers each extent of a window separately (ibv_reg_mr_iova, iova = iova
// base + the extent's offset in the region) in a protection domain of the window's peer
// alone (verbs/nic.h, PeerDomain), and pushes the rkeys on the control link
// (verbs/wire.h, WINDOW_ADD). The source maps (window key, offset, bytes) to the one
// extent holding the whole write, and writes with that extent's rkey at remote address
// = iova base + offset. A
// write that no extent holds, or through a key it was never given (or was told is
// closed), is not posted: the target is asked why it refuses it (QUERY), so that the
// refusal a caller sees is the target's, exactly as over TCP.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/verbs/wire.h"
#include "agent/fabric/window_table.h"

namespace fuselink::fabric::verbs {

// Windows one source keeps per control link (one NIC of one target): the target's own
// bound on open windows, so a well-behaved target never reaches it.
inline constexpr size_t kMaxRemoteWindowsPerLink = kMaxWindows;

// Where a write goes at the target: the RDMA WRITE's remote address and rkey.
struct RemoteTarget {
  uint64_t address = 0;
  uint32_t rkey = 0;
  bool operator==(const RemoteTarget&) const = default;
};

// One window on one NIC: sorted, disjoint, non-empty extents with one rkey each.
class RemoteWindow {
 public:
  // INVALID_ARGUMENT unless the records hold 1..kMaxWindowExtents extents, each
  // non-empty, sorted, disjoint and not wrapping around 2^64 (with `iova_base` added).
  // A target's bytes: checked, never trusted.
  static absl::StatusOr<RemoteWindow> FromRecords(
      uint64_t iova_base, std::span<const wire::WindowRecord> records);

  // The target of the extent that holds all of [offset, offset + bytes); none when no
  // single extent does (bytes > 0). Does not allocate.
  std::optional<RemoteTarget> Resolve(uint64_t offset, uint64_t bytes) const;
  size_t extent_count() const { return extents_.size(); }

 private:
  RemoteWindow(uint64_t iova_base, std::vector<Extent> extents,
               std::vector<uint32_t> rkeys)
      : iova_base_(iova_base), extents_(std::move(extents)), rkeys_(std::move(rkeys)) {}
  uint64_t iova_base_ = 0;
  std::vector<Extent> extents_;
  std::vector<uint32_t> rkeys_;  // [extent]
};

// The windows of one link, by key. Thread-safe: the link's thread adds and removes,
// PostWrite resolves.
class RemoteWindowTable {
 public:
  // Adds or replaces `key`. RESOURCE_EXHAUSTED past kMaxRemoteWindowsPerLink.
  absl::Status Add(WindowKey key, RemoteWindow window);
  void Remove(WindowKey key);
  // See RemoteWindow::Resolve; none for an unknown key. Does not allocate.
  std::optional<RemoteTarget> Resolve(WindowKey key, uint64_t offset,
                                      uint64_t bytes) const;
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<WindowKey, RemoteWindow> windows_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fuselink::fabric::verbs
