// The tensors engines lent to this agent, by name. Each is mapped once and
// registered with the fabric once; transfers pin it with a lease so it cannot be
// unregistered under them. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/stats.h"
#include "agent/common/unique_fd.h"
#include "agent/fabric/fabric.h"
#include "agent/memory/layout.h"
#include "agent/memory/lender.h"
#include "agent/memory/memory_extent.h"

namespace fuselink::memory {

// Bound on tensors registered at once.
inline constexpr size_t kMaxTensors = 65536;
// Tensor names: 1 to kMaxNameBytes characters of [A-Za-z0-9._/-].
inline constexpr size_t kMaxNameBytes = 128;

// What one owner (the identity that registered; "" under open access, one share for
// every caller) may hold at once, so that one engine cannot take the whole registry.
// A registration past either is RESOURCE_EXHAUSTED with the reason named.
struct OwnerShares {
  // Tensors registered at once (TENSOR_SHARE); 1 to kMaxTensors.
  size_t max_tensors = kMaxTensors / 4;
  // Layout parts (Layout::parts entries: the layout's own memory, 32 bytes each) over
  // all its tensors (LAYOUT_PART_SHARE): 32 MiB by default; at least 1 (under
  // kMaxLayoutParts it also refuses single tensors with more parts than that).
  size_t max_layout_parts = size_t{1} << 20;

  // INVALID_ARGUMENT naming the first share out of its range (common/options.h).
  absl::Status Validate() const;
};

// Registrations refused because their owner held its share (OwnerShares), by bound.
struct ShareRefusals {
  uint64_t tensors = 0;       // TENSOR_SHARE
  uint64_t layout_parts = 0;  // LAYOUT_PART_SHARE
};

// INVALID_ARGUMENT (reason BAD_NAME) unless `name` is a valid tensor name.
absl::Status ValidateName(absl::string_view name);

struct TensorInfo {
  std::string name;
  Layout layout;
  std::string memory_kind;  // "host", "cuda_ipc" or "vmm"
  uint64_t size_bytes = 0;  // every region's
  std::vector<uint64_t> region_bytes;
  uint32_t home_gpu = 0;  // for GPU memory: the GPU that holds it
  // Who may use it (agent/security/policy.h): kept here as given, checked by the
  // services. `owner` is the registering identity (empty under open access).
  std::string owner;
  std::vector<std::string> readers;
  std::vector<std::string> writers;
  // The process that lent the memory, as the kernel named it to the handle socket
  // (SO_PEERCRED); filled by the caller of Register* from the descriptor's token,
  // kept as given. Unknown for GPU memory lent without any descriptor.
  Lender lender;
  // Its regions' memory (filled by Register*), to tell tensors that alias apart.
  std::vector<MemoryExtent> memory;
};

// A tensor whose owner process exited: no longer registered under its name; its region
// is still registered until the caller has stopped what uses it and deregisters it.
struct Revoked {
  std::string name;
  uint64_t id = 0;
  std::vector<fabric::RegionKey> region_keys;
};

// One region of memory a tensor is lent in, as the caller mapped or imported it: host
// memory, or a device address on the tensor's GPU, alive while `keepalive` is.
struct RegionMemory {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  std::shared_ptr<const void> keepalive;
  // The file extent it maps, if any; else (file {0, 0}) its addresses are taken.
  MemoryExtent extent;
};

// A registered region: where it is, and the fabric's key for it.
struct Region {
  uint8_t* base = nullptr;  // host memory, or a device address
  uint64_t bytes = 0;
  fabric::RegionKey key = 0;
};

class Registry;

// A pinned tensor: its memory stays mapped and registered while the lease lives.
class TensorLease {
 public:
  TensorLease() = default;
  TensorLease(TensorLease&&) = default;
  TensorLease& operator=(TensorLease&& other) noexcept;
  ~TensorLease() { Release(); }

  const TensorInfo& info() const;
  // The tensor's regions, as its layout numbers them (layout.h); on gpu() when that
  // is not -1.
  const std::vector<Region>& regions() const;
  // -1 for host memory.
  int gpu() const;
  // Unique among every tensor this registry ever held.
  uint64_t id() const;
  bool valid() const { return record_ != nullptr; }

 private:
  friend class Registry;
  struct Record;
  explicit TensorLease(std::shared_ptr<Record> record) : record_(std::move(record)) {}
  void Release();
  std::shared_ptr<Record> record_;
};

class Registry {
 public:
  explicit Registry(fabric::Fabric* fabric, OwnerShares shares = {})
      : fabric_(fabric), shares_(shares) {}

  // Registers `regions` with the fabric as one tensor under `want.name`: host memory
  // when `gpu` is -1, else memory on GPU `gpu` (`want.memory_kind` says how it was
  // imported). `want` gives the name, layout and home GPU; the layout is normalized
  // and checked against the regions, and no two regions may be one memory
  // (INVALID_ARGUMENT, ALIASED_REGIONS). `owner` (may be empty): a pidfd of the process
  // that lent the memory (INVALID_ARGUMENT, BAD_OWNER_FD, when it is no pidfd); see
  // TakeExitedOwners. RESOURCE_EXHAUSTED (TENSOR_SHARE, LAYOUT_PART_SHARE) when
  // `want.owner` would hold more than its OwnerShares.
  absl::StatusOr<TensorInfo> Register(TensorInfo want, std::vector<RegionMemory> regions,
                                      int gpu, UniqueFd owner = UniqueFd());
  // One region of host memory mapped from `fd`.
  absl::StatusOr<TensorInfo> RegisterHost(TensorInfo want, UniqueFd fd,
                                          uint64_t offset_bytes, uint64_t size_bytes,
                                          UniqueFd owner = UniqueFd());
  // One region of GPU memory: [address, address + size_bytes) on `gpu`.
  absl::StatusOr<TensorInfo> RegisterGpu(TensorInfo want, uint64_t address, int gpu,
                                         uint64_t size_bytes,
                                         std::shared_ptr<const void> memory,
                                         UniqueFd owner = UniqueFd());
  // Tensors whose owner process has exited since the last call, taken out of the
  // registry (their names are free again; leases stay valid). The caller stops the
  // transfers that use them, then deregisters their regions from the fabric.
  std::vector<Revoked> TakeExitedOwners();
  // NOT_FOUND if unknown; FAILED_PRECONDITION (TENSOR_IN_USE) while leased; what
  // `check` (may be null) says of the tensor, under the registry's lock, otherwise.
  absl::Status Unregister(
      absl::string_view name, absl::FunctionRef<absl::Status(const TensorInfo&)> check =
                                  [](const TensorInfo&) { return absl::OkStatus(); });
  absl::StatusOr<TensorInfo> Get(absl::string_view name) const;
  // Up to `limit` tensors named after `after`, in name order: every one, or with
  // `owner` that owner's only (no other's is walked); `*more` tells whether others
  // follow. Under the registry's lock only pointers are taken: a registered tensor's
  // info never changes, so the caller copies it without the lock transfers pin with.
  std::vector<std::shared_ptr<const TensorInfo>> List(
      absl::string_view after, size_t limit, bool* more,
      std::optional<absl::string_view> owner = std::nullopt) const;
  // Pins a tensor for a transfer. NOT_FOUND (UNKNOWN_TENSOR) if unknown.
  absl::StatusOr<TensorLease> Acquire(absl::string_view name);
  size_t size() const;
  ShareRefusals share_refusals() const {
    return {tensor_share_refusals_.load(), layout_part_share_refusals_.load()};
  }

  // Tensors registered, and the registrations refused past an engine's share.
  void ReportStats(stats::Sink& sink) const;

 private:
  using Records =
      std::map<std::string, std::shared_ptr<TensorLease::Record>, std::less<>>;
  // One owner's tensors by name, and their layout parts.
  struct Holding {
    Records tensors;
    size_t layout_parts = 0;
  };

  absl::Status CheckRoom(const TensorInfo& want) const;
  // RESOURCE_EXHAUSTED (TENSOR_SHARE, LAYOUT_PART_SHARE), counted, unless `want`'s
  // owner has room for it.
  absl::Status CheckShareLocked(const TensorInfo& want) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the tensor at `it` out of tensors_ and its owner's holding.
  Records::iterator EraseLocked(Records::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deregister(const std::vector<Region>& regions);

  fabric::Fabric* const fabric_;
  const OwnerShares shares_;
  std::atomic<uint64_t> next_id_{1};
  mutable std::atomic<uint64_t> tensor_share_refusals_{0};
  mutable std::atomic<uint64_t> layout_part_share_refusals_{0};
  mutable absl::Mutex mu_;
  Records tensors_ ABSL_GUARDED_BY(mu_);
  // The same tensors by owner: shares are counted, and an owner's listing walked,
  // here. An owner with no tensor has no entry.
  absl::flat_hash_map<std::string, Holding> holdings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fuselink::memory
