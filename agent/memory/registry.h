// The tensors engines lent to this agent, by name. Each is mapped once and
// registered with the fabric once; transfers pin it with a lease so it cannot be
// unregistered under them. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/unique_fd.h"
#include "agent/fabric/fabric.h"
#include "agent/memory/layout.h"

namespace fuselink::memory {

// Bound on tensors registered at once.
inline constexpr size_t kMaxTensors = 65536;
// Tensor names: 1 to kMaxNameBytes characters of [A-Za-z0-9._/-].
inline constexpr size_t kMaxNameBytes = 128;

// INVALID_ARGUMENT (reason BAD_NAME) unless `name` is a valid tensor name.
absl::Status ValidateName(absl::string_view name);

struct TensorInfo {
  std::string name;
  Layout layout;
  std::string memory_kind;  // "host"
  uint64_t size_bytes = 0;
  uint32_t home_gpu = 0;
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
  uint8_t* base() const;
  fabric::RegionKey region_key() const;

 private:
  friend class Registry;
  struct Record;
  explicit TensorLease(std::shared_ptr<Record> record) : record_(std::move(record)) {}
  void Release();
  std::shared_ptr<Record> record_;
};

class Registry {
 public:
  explicit Registry(fabric::Fabric* fabric) : fabric_(fabric) {}

  // Maps host memory from `fd` and registers it under `want.name`. `want` gives the
  // name, layout and home GPU; the layout is normalized and checked against
  // `size_bytes`.
  absl::StatusOr<TensorInfo> RegisterHost(TensorInfo want, UniqueFd fd,
                                          uint64_t offset_bytes, uint64_t size_bytes);
  // NOT_FOUND if unknown; FAILED_PRECONDITION (TENSOR_IN_USE) while leased.
  absl::Status Unregister(absl::string_view name);
  absl::StatusOr<TensorInfo> Get(absl::string_view name) const;
  // Up to `limit` tensors named after `after`, in name order; `*more` tells whether
  // others follow.
  std::vector<TensorInfo> List(absl::string_view after, size_t limit, bool* more) const;
  // Pins a tensor for a transfer. NOT_FOUND (UNKNOWN_TENSOR) if unknown.
  absl::StatusOr<TensorLease> Acquire(absl::string_view name);
  size_t size() const;

 private:
  fabric::Fabric* const fabric_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<TensorLease::Record>, std::less<>> tensors_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace fuselink::memory
