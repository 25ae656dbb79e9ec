#include "agent/gpu/stream_set.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/errors.h"
#include "agent/common/status_macros.h"

namespace fuselink::gpu {
namespace {

struct Held {
  std::unique_ptr<StreamSet> streams;
  std::shared_ptr<void> memory;
  uint64_t bytes = 0;
};

struct Kept {
  absl::Mutex mu;
  std::vector<Held> held ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> bytes{0};
};

Kept& TheKept() {
  static Kept* const kept = new Kept;  // never destroyed: late copies may still run
  return *kept;
}

}  // namespace

absl::StatusOr<Stream*> StreamSet::For(int gpu) {
  if (stuck_) {
    return WithReason(absl::FailedPreconditionError(
                          "an earlier GPU copy on these streams never finished"),
                      reasons::kGpuCopyTimeout);
  }
  if (!runtime_->has(gpu)) {
    return absl::FailedPreconditionError(absl::StrCat("no GPU ", gpu, " here"));
  }
  if (!streams_[gpu].has_value()) {
    FL_ASSIGN_OR_RETURN(streams_[gpu], Stream::Create(runtime_->context(gpu)));
  }
  busy_[gpu] = true;
  return &*streams_[gpu];
}

absl::Status StreamSet::Wait(absl::string_view what) {
  absl::Status first;
  for (size_t g = 0; g < streams_.size() && !stuck_; ++g) {
    if (!busy_[g]) continue;
    Stream& stream = *streams_[g];
    absl::Status done = bound_->Wait([&stream] { return stream.Done(); },
                                     absl::StrCat(what, " on GPU ", g));
    if (absl::IsDeadlineExceeded(done)) stuck_ = true;  // busy_ stays: Idle asks
    first.Update(std::move(done));
    if (!stuck_) busy_[g] = false;
  }
  return first;
}

bool StreamSet::Idle() {
  for (size_t g = 0; g < streams_.size(); ++g) {
    if (!busy_[g]) continue;
    absl::StatusOr<bool> done = streams_[g]->Done();
    // A stream in error has stopped: nothing of it runs any more.
    if (done.ok() && !*done) return false;
  }
  return true;
}

void KeepUntilIdle(std::unique_ptr<StreamSet> streams, std::shared_ptr<void> memory,
                   uint64_t bytes) {
  if (!streams->stuck() || streams->Idle()) return;  // nothing may still touch it
  Kept& kept = TheKept();
  kept.bytes.fetch_add(bytes, std::memory_order_relaxed);
  absl::MutexLock lock(&kept.mu);
  kept.held.push_back(
      Held{.streams = std::move(streams), .memory = std::move(memory), .bytes = bytes});
}

void FreeIdleKept() {
  Kept& kept = TheKept();
  std::vector<Held> idle;  // freed with the lock released
  {
    absl::MutexLock lock(&kept.mu);
    for (size_t i = 0; i < kept.held.size();) {
      if (!kept.held[i].streams->Idle()) {
        ++i;
        continue;
      }
      kept.bytes.fetch_sub(kept.held[i].bytes, std::memory_order_relaxed);
      idle.push_back(std::move(kept.held[i]));
      kept.held[i] = std::move(kept.held.back());
      kept.held.pop_back();
    }
  }
}

uint64_t kept_bytes() { return TheKept().bytes.load(std::memory_order_relaxed); }

}  // namespace fuselink::gpu
