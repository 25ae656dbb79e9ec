#include "agent/fabric/verbs/window.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace fuselink::fabric::verbs {

absl::StatusOr<RemoteWindow> RemoteWindow::FromRecords(
    uint64_t iova_base, std::span<const wire::WindowRecord> records) {
  if (records.empty() || records.size() > kMaxWindowExtents) {
    return absl::InvalidArgumentError(absl::StrCat("a window has 1..", kMaxWindowExtents,
                                                   " extents, not ", records.size()));
  }
  std::vector<Extent> extents;
  std::vector<uint32_t> rkeys;
  extents.reserve(records.size());
  rkeys.reserve(records.size());
  uint64_t end = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const wire::WindowRecord& r = records[i];
    if (r.bytes == 0 || r.offset > UINT64_MAX - r.bytes ||
        r.offset + r.bytes > UINT64_MAX - iova_base || (i > 0 && r.offset < end)) {
      return absl::InvalidArgumentError(
          absl::StrCat("window extent ", i, " [", r.offset, ", +", r.bytes,
                       ") is empty, unsorted, overlapping or wraps"));
    }
    end = r.offset + r.bytes;
    extents.push_back({.offset = r.offset, .bytes = r.bytes});
    rkeys.push_back(r.rkey);
  }
  return RemoteWindow(iova_base, std::move(extents), std::move(rkeys));
}

std::optional<RemoteTarget> RemoteWindow::Resolve(uint64_t offset, uint64_t bytes) const {
  // The last extent that starts at or before `offset`.
  auto it = std::upper_bound(extents_.begin(), extents_.end(), offset,
                             [](uint64_t o, const Extent& e) { return o < e.offset; });
  if (it == extents_.begin()) return std::nullopt;
  --it;
  if (!ExtentFits(offset - it->offset, bytes, it->bytes)) return std::nullopt;
  return RemoteTarget{.address = iova_base_ + offset,
                      .rkey = rkeys_[static_cast<size_t>(it - extents_.begin())]};
}

absl::Status RemoteWindowTable::Add(WindowKey key, RemoteWindow window) {
  absl::MutexLock lock(&mu_);
  if (windows_.size() >= kMaxRemoteWindowsPerLink && !windows_.contains(key)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the target pushed more than ", kMaxRemoteWindowsPerLink, " windows"));
  }
  windows_.insert_or_assign(key, std::move(window));
  return absl::OkStatus();
}

void RemoteWindowTable::Remove(WindowKey key) {
  absl::MutexLock lock(&mu_);
  windows_.erase(key);
}

std::optional<RemoteTarget> RemoteWindowTable::Resolve(WindowKey key, uint64_t offset,
                                                       uint64_t bytes) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = windows_.find(key);
  if (it == windows_.end()) return std::nullopt;
  return it->second.Resolve(offset, bytes);
}

size_t RemoteWindowTable::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return windows_.size();
}

}  // namespace fuselink::fabric::verbs
