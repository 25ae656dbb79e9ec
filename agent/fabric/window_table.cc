#include "agent/fabric/window_table.h"

#include <sys/random.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"

namespace fuselink::fabric {

struct WindowTable::Placement::Window {
  std::shared_ptr<const Region> region;
  const std::string peer_name;
  const std::vector<Extent> extents;

  absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  uint32_t placing ABSL_GUARDED_BY(mu) = 0;
  absl::AnyInvocable<void() &&> drained ABSL_GUARDED_BY(mu);

  Window(std::shared_ptr<const Region> r, std::string peer, std::vector<Extent> e)
      : region(std::move(r)), peer_name(std::move(peer)), extents(std::move(e)) {}
};

absl::Status RefusalStatus(Refusal refusal) {
  switch (refusal) {
    case Refusal::kNone:
      return absl::OkStatus();
    case Refusal::kNoWindow:
      return WithReason(absl::NotFoundError("the target has no open window under that "
                                            "key: the transfer ended there"),
                        reasons::kWindowClosed);
    case Refusal::kNotYourWindow:
      return WithReason(
          absl::PermissionDeniedError("the target's window belongs to another peer"),
          reasons::kWindowNotYours);
    case Refusal::kOutsideWindow:
      return WithReason(absl::OutOfRangeError("the write lies outside the blocks the "
                                              "target prepared for the transfer"),
                        reasons::kOutsideWindow);
  }
  return WithReason(absl::InternalError("the target refused the write"),
                    reasons::kRefused);
}

absl::Status CheckWindowExtents(std::span<const Extent> extents, uint64_t region_bytes) {
  if (extents.empty() || extents.size() > kMaxWindowExtents) {
    return absl::InvalidArgumentError(absl::StrCat("a window has 1..", kMaxWindowExtents,
                                                   " extents, not ", extents.size()));
  }
  uint64_t end = 0;
  for (size_t i = 0; i < extents.size(); ++i) {
    const Extent& e = extents[i];
    if (e.bytes == 0 || !ExtentFits(e.offset, e.bytes, region_bytes) ||
        (i > 0 && e.offset < end)) {
      return absl::InvalidArgumentError(
          absl::StrCat("window extent ", i, " [", e.offset, ", +", e.bytes,
                       ") is empty, unsorted, overlapping or outside the region"));
    }
    end = e.offset + e.bytes;
  }
  return absl::OkStatus();
}

bool InsideExtents(std::span<const Extent> extents, uint64_t offset, uint64_t bytes) {
  // The last extent that starts at or before `offset`.
  auto it = std::upper_bound(extents.begin(), extents.end(), offset,
                             [](uint64_t o, const Extent& e) { return o < e.offset; });
  if (it == extents.begin()) return false;
  --it;
  return ExtentFits(offset - it->offset, bytes, it->bytes);
}

WindowTable::Placement& WindowTable::Placement::operator=(Placement&& other) noexcept {
  if (this != &other) {
    this->~Placement();
    window_ = std::move(other.window_);
    region_ = std::move(other.region_);
  }
  return *this;
}

WindowTable::Placement::~Placement() {
  if (window_ == nullptr) return;
  absl::AnyInvocable<void() &&> drained;
  {
    absl::MutexLock lock(&window_->mu);
    // One too many would let a window drain, and its slot end, under a write.
    FL_CHECK(window_->placing > 0, "a window's placement ended twice");
    if (--window_->placing == 0 && window_->closed) drained = std::move(window_->drained);
  }
  window_.reset();
  region_.reset();
  if (drained) std::move(drained)();
}

absl::StatusOr<WindowKey> WindowTable::Open(std::shared_ptr<const Region> region,
                                            absl::string_view peer_name,
                                            std::span<const Extent> extents) {
  FL_RETURN_IF_ERROR(CheckWindowExtents(extents, region->bytes));
  auto window = std::make_shared<Placement::Window>(
      std::move(region), std::string(peer_name),
      std::vector<Extent>(extents.begin(), extents.end()));
  absl::MutexLock lock(&mu_);
  if (windows_.size() >= kMaxWindows) {
    return absl::ResourceExhaustedError(
        absl::StrCat("already ", kMaxWindows, " windows open"));
  }
  for (;;) {
    WindowKey key = 0;
    if (getrandom(&key, sizeof(key), 0) != sizeof(key)) {
      return ErrnoStatus("getrandom(window key)", errno);
    }
    if (key == 0 || windows_.contains(key)) continue;
    windows_.emplace(key, std::move(window));
    return key;
  }
}

void WindowTable::Close(WindowKey key, absl::AnyInvocable<void() &&> drained) {
  std::shared_ptr<Placement::Window> window;
  {
    absl::MutexLock lock(&mu_);
    auto it = windows_.find(key);
    if (it != windows_.end()) {
      window = std::move(it->second);
      windows_.erase(it);
    }
  }
  if (window != nullptr) {
    absl::MutexLock lock(&window->mu);
    FL_DCHECK(!window->closed, "a window closed twice");
    window->closed = true;
    if (window->placing > 0) {
      window->drained = std::move(drained);
      return;
    }
  }
  if (drained) std::move(drained)();
}

std::variant<WindowTable::Placement, Refusal> WindowTable::Admit(
    WindowKey key, absl::string_view peer_name, uint64_t offset, uint64_t bytes) const {
  std::shared_ptr<Placement::Window> window;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = windows_.find(key);
    if (it == windows_.end()) return Refusal::kNoWindow;
    window = it->second;
  }
  if (window->peer_name != peer_name) return Refusal::kNotYourWindow;
  if (!InsideExtents(window->extents, offset, bytes)) return Refusal::kOutsideWindow;
  {
    absl::MutexLock lock(&window->mu);
    if (window->closed) return Refusal::kNoWindow;
    ++window->placing;
  }
  std::shared_ptr<const Region> region = window->region;
  return Placement(std::move(window), std::move(region));
}

size_t WindowTable::open_windows() const {
  absl::ReaderMutexLock lock(&mu_);
  return windows_.size();
}

}  // namespace fuselink::fabric
