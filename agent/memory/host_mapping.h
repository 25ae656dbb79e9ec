// Host memory lent by an engine as a memfd (or any mappable file), mapped shared.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"

namespace fuselink::memory {

// One mmap of a file, unmapped on destruction. Not copyable.
class HostMapping {
 public:
  // Maps `size_bytes` at `offset_bytes` of `fd`, read-write, shared with the file's
  // other users. Seals the file against shrinking first (FAILED_PRECONDITION,
  // UNSEALED_MEMORY, when it cannot be: not a memfd, or made without
  // MFD_ALLOW_SEALING), and FAILED_PRECONDITION (WRITE_SEALED_MEMORY) when it is
  // sealed against writes (F_SEAL_WRITE, F_SEAL_FUTURE_WRITE); INVALID_ARGUMENT when
  // the file is shorter or the offset unaligned.
  static absl::StatusOr<std::unique_ptr<HostMapping>> Map(UniqueFd fd,
                                                          uint64_t offset_bytes,
                                                          uint64_t size_bytes);
  ~HostMapping();
  HostMapping(const HostMapping&) = delete;
  HostMapping& operator=(const HostMapping&) = delete;

  void* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }

 private:
  HostMapping(void* data, uint64_t size_bytes) : data_(data), size_bytes_(size_bytes) {}
  void* data_;
  uint64_t size_bytes_;
};

}  // namespace fuselink::memory
