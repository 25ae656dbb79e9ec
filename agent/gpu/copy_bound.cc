#include "agent/gpu/copy_bound.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "agent/common/errors.h"
#include "agent/common/status_macros.h"
#include "agent/gpu/stream_set.h"

namespace fuselink::gpu {

absl::Status CopyBound::Wait(absl::FunctionRef<absl::StatusOr<bool>()> done,
                             absl::string_view what) {
  const absl::Time start = absl::Now();
  for (;;) {
    absl::StatusOr<bool> finished = done();
    if (!finished.ok()) return finished.status();
    if (*finished) return absl::OkStatus();
    const absl::Duration waited = absl::Now() - start;
    if (waited > bound_) break;
    if (waited < kSpin) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(kNap);
    }
  }
  timeouts_.fetch_add(1, std::memory_order_relaxed);
  return WithReason(absl::DeadlineExceededError(absl::StrCat(
                        what, " did not finish within ", absl::FormatDuration(bound_),
                        " (--gpu_copy_timeout_ms): its memory stays out of use")),
                    reasons::kGpuCopyTimeout);
}

void CopyBound::ReportStats(stats::Sink& sink) const {
  static constexpr stats::Family kTimeouts{
      "fuselink_gpu_copy_timeouts_total",
      "GPU copies the agent stopped waiting for after --gpu_copy_timeout_ms; the memory "
      "each touches stays out of use until it finishes. Non-zero means a GPU is hung.",
      stats::Kind::kCounter};
  static constexpr stats::Family kKept{
      "fuselink_gpu_copy_kept_bytes",
      "Staging memory held back because a copy past --gpu_copy_timeout_ms may still "
      "touch it; given back once the GPU finishes the copy.",
      stats::Kind::kGauge};
  sink.Add(kTimeouts, static_cast<double>(timeouts()));
  sink.Add(kKept, static_cast<double>(kept_bytes()));
}

}  // namespace fuselink::gpu
