// Open windows of one fabric, by key: which peer may write which extents of which
// region. The software half of the placement rule: a transport whose NIC cannot
// enforce windows (TCP) checks every write here before it places a byte; one that can
// (verbs, with memory windows) keeps its bookkeeping here too. Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/region_table.h"

namespace fuselink::fabric {

// Windows one fabric holds open at once.
inline constexpr size_t kMaxWindows = 1 << 16;

// Checks a window's extents against its region: 1..kMaxWindowExtents extents, each
// non-empty, sorted, disjoint, inside `region_bytes`. INVALID_ARGUMENT otherwise.
absl::Status CheckWindowExtents(std::span<const Extent> extents, uint64_t region_bytes);

// True when [offset, offset + bytes) lies inside one of `extents` (sorted, disjoint).
bool InsideExtents(std::span<const Extent> extents, uint64_t offset, uint64_t bytes);

class WindowTable {
 public:
  // A write admitted into a window: the region stays alive, and the window counts the
  // write as placing until this is destroyed, after the bytes are in place (or not).
  class Placement {
   public:
    Placement() = default;
    Placement(Placement&& other) noexcept { *this = std::move(other); }
    Placement& operator=(Placement&& other) noexcept;
    ~Placement();
    const Region& region() const { return *region_; }
    std::shared_ptr<const Region> shared_region() const { return region_; }

   private:
    friend class WindowTable;
    struct Window;
    Placement(std::shared_ptr<Window> window, std::shared_ptr<const Region> region)
        : window_(std::move(window)), region_(std::move(region)) {}
    std::shared_ptr<Window> window_;
    std::shared_ptr<const Region> region_;
  };

  // Opens a window on `region` for `peer_name`. RESOURCE_EXHAUSTED past kMaxWindows.
  absl::StatusOr<WindowKey> Open(std::shared_ptr<const Region> region,
                                 absl::string_view peer_name,
                                 std::span<const Extent> extents);
  // See Fabric::CloseWindow.
  void Close(WindowKey key, absl::AnyInvocable<void() &&> drained);
  // Admits a write of [offset, offset + bytes) through `key` from `peer_name`, or says
  // why not. Does not allocate.
  std::variant<Placement, Refusal> Admit(WindowKey key, absl::string_view peer_name,
                                         uint64_t offset, uint64_t bytes) const;
  size_t open_windows() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<WindowKey, std::shared_ptr<Placement::Window>> windows_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace fuselink::fabric
