#include "agent/memory/host_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::memory {
namespace {

#ifdef MADV_POPULATE_WRITE
constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kPopulateWrite = 23;        // the Linux value, for older headers
#endif
#ifdef F_SEAL_FUTURE_WRITE
constexpr int kSealFutureWrite = F_SEAL_FUTURE_WRITE;
#else
constexpr int kSealFutureWrite = 0x0010;  // the Linux value, for older headers
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<HostMapping>> HostMapping::Map(UniqueFd fd,
                                                              uint64_t offset_bytes,
                                                              uint64_t size_bytes) {
  const uint64_t page_bytes = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (size_bytes == 0) {
    return WithReason(absl::InvalidArgumentError("host memory: size_bytes is 0"),
                      reasons::kBadMemory);
  }
  if (offset_bytes % page_bytes != 0) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          "host memory: offset_bytes ", offset_bytes,
                          " is not a multiple of the page size ", page_bytes)),
                      reasons::kBadMemory);
  }
  // A lender that could shrink the file under the mapping would turn every later
  // access into SIGBUS, killing every transfer on the node: the file must be sealed
  // against shrinking, by the lender or here (a memfd made with MFD_ALLOW_SEALING).
  // Sealed first, measured after, so the size checked is the size that stays.
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 ||
      (!(seals & F_SEAL_SHRINK) && fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) != 0)) {
    return WithReason(
        absl::FailedPreconditionError(
            "host memory: the file cannot be sealed against shrinking (F_SEAL_SHRINK); "
            "lend a memfd made with MFD_ALLOW_SEALING, or seal it first"),
        reasons::kUnsealedMemory);
  }
  // The agent writes what lands into the mapping: a file sealed against writes
  // cannot be mapped writable (mmap says EPERM, which would read as the caller's
  // permission).
  if (seals & (F_SEAL_WRITE | kSealFutureWrite)) {
    return WithReason(
        absl::FailedPreconditionError(
            "host memory: the file is sealed against writes (F_SEAL_WRITE or "
            "F_SEAL_FUTURE_WRITE) and the agent maps it writable to land transfers; "
            "lend a memfd without those seals"),
        reasons::kWriteSealedMemory);
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat(memfd)", errno);
  uint64_t end = 0;
  if (__builtin_add_overflow(offset_bytes, size_bytes, &end) ||
      end > static_cast<uint64_t>(st.st_size)) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          "host memory: offset ", offset_bytes, " + size ", size_bytes,
                          " is past the end of the file (", st.st_size, " bytes)")),
                      reasons::kBadMemory);
  }
  void* data = mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(),
                    static_cast<off_t>(offset_bytes));
  if (data == MAP_FAILED) return ErrnoStatus("mmap(memfd)", errno);
  // Huge pages where the node allows them for shared memory (transparent_hugepage/
  // shmem_enabled: advise, within_size or always): pages the lender has not touched
  // yet are then made 2 MiB at a time, and khugepaged may collapse the others. On the
  // project's test machine the TCP fabric's socket copies over new 4 KiB pages made a
  // tensor's first transfer 7-8x slower than its later ones, and over huge pages not
  // (docs/benchmarks.md, "Huge pages"). Advice only: with shmem_enabled=never, or on a
  // kernel without it, nothing changes.
  madvise(data, size_bytes, MADV_HUGEPAGE);
  // Fault the pages in now, once, rather than on the first transfer (which otherwise
  // runs at half speed: a page fault per 4 KiB landed). Best effort: kernels before
  // 5.14 lack the advice, and the mapping works without it.
  madvise(data, size_bytes, kPopulateWrite);
  return std::unique_ptr<HostMapping>(new HostMapping(data, size_bytes));
}

HostMapping::~HostMapping() { munmap(data_, size_bytes_); }

}  // namespace fuselink::memory
