#include "agent/transfer/transfer_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/admission.h"

namespace fuselink::transfer {

absl::StatusOr<TransferRegistry::JobPtr> TransferRegistry::ExistingLocked(
    const std::string& request_id, absl::string_view fingerprint) const {
  auto it = by_request_.find(request_id);
  if (it == by_request_.end() || it->second.free) return JobPtr();
  if (it->second.job->transfer()->fingerprint() == fingerprint) return it->second.job;
  return WithReason(
      absl::AlreadyExistsError(absl::StrCat(
          "request_id '", BoundedForMessage(it->second.job->transfer()->request_id()),
          "' was already used for a transfer with other content")),
      reasons::kRequestIdReused);
}

absl::StatusOr<TransferRegistry::JobPtr> TransferRegistry::Existing(
    const std::string& request_id, absl::string_view fingerprint) const {
  absl::ReaderMutexLock lock(&mu_);
  return ExistingLocked(request_id, fingerprint);
}

uint32_t TransferRegistry::NextSerialLocked() {
  // 2^32 serials before one repeats; a live one is never reused.
  for (;;) {
    const uint32_t serial = next_serial_++;
    if (serial != 0 && !live_.contains(serial)) return serial;
  }
}

absl::StatusOr<TransferRegistry::JobPtr> TransferRegistry::Admit(
    const std::string& request_id, absl::string_view fingerprint, MakeJob make,
    bool* fresh, absl::string_view requester) {
  *fresh = false;
  absl::MutexLock lock(&mu_);
  FL_ASSIGN_OR_RETURN(JobPtr existing, ExistingLocked(request_id, fingerprint));
  if (existing != nullptr) return existing;
  if (closed_) return ShuttingDownStatus();
  if (active_ >= options_.max_active) {
    return WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            options_.max_active, " transfers are already in flight; retry later")),
        reasons::kTooManyTransfers);
  }
  if (auto held = active_by_requester_.find(requester);
      held != active_by_requester_.end() &&
      held->second >= options_.max_active_per_requester) {
    ++share_refusals_;
    return WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            requester.empty() ? std::string("every caller (open access)")
                              : absl::StrCat("'", BoundedForMessage(requester), "'"),
            " already has ", held->second,
            " transfers in flight here, its share (--max_transfers_per_router); "
            "retry later")),
        reasons::kTransferShare);
  }
  JobPtr job = make(NextSerialLocked(), next_number_++);
  ++active_;
  ++active_by_requester_[job->requester()];
  live_.emplace(job->serial(), job);
  by_id_.emplace(job->transfer()->id(), job);
  by_request_[request_id] = Request{job, false};
  *fresh = true;
  return job;
}

TransferRegistry::JobPtr TransferRegistry::FindLive(uint32_t serial) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = live_.find(serial);
  return it == live_.end() ? nullptr : it->second;
}

std::string TransferRegistry::RequestKey(absl::string_view requester,
                                         absl::string_view request_id) {
  // A request id is at most 128 bytes of UTF-8 (CheckRequestId); the length prefix
  // keeps two different pairs from making one key.
  return absl::StrCat(requester.size(), ":", requester, request_id);
}

absl::StatusOr<TransferRegistry::JobPtr> TransferRegistry::Find(
    absl::string_view transfer_id, absl::string_view request_id) const {
  absl::ReaderMutexLock lock(&mu_);
  if (!transfer_id.empty()) {
    if (auto it = by_id_.find(transfer_id); it != by_id_.end()) return it->second;
  } else if (!request_id.empty()) {
    if (auto it = by_request_.find(request_id); it != by_request_.end()) {
      return it->second.job;
    }
  }
  return WithReason(absl::NotFoundError(absl::StrCat(
                        "no transfer '",
                        BoundedForMessage(transfer_id.empty() ? request_id : transfer_id),
                        "' on this node")),
                    reasons::kUnknownTransfer);
}

std::vector<TransferRegistry::JobPtr> TransferRegistry::Live() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<JobPtr> jobs;
  jobs.reserve(live_.size());
  for (const auto& [serial, job] : live_) jobs.push_back(job);
  return jobs;
}

void TransferRegistry::Accepted(const JobPtr& job, const std::string& target_node,
                                uint32_t slot, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  const bool live = live_.contains(job->serial());  // else it ended meanwhile
  auto it = by_target_.find(target_node);
  if (it == by_target_.end()) {
    if (!live) return;  // no job of the node's to tell apart
    it = by_target_.emplace(target_node, Target{}).first;
  }
  // Heard last: an accept of a node's previous incarnation cannot follow one of
  // its next (the previous one had exited before the next one started).
  it->second.incarnation = incarnation;
  if (live) it->second.jobs.push_back(AcceptedJob{slot, incarnation, job});
}

TransferRegistry::JobPtr TransferRegistry::FindByVerdict(
    absl::string_view target_node, const VerdictNotice& notice) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = by_target_.find(target_node);
  if (it == by_target_.end()) return nullptr;
  for (const AcceptedJob& accepted : it->second.jobs) {
    if (accepted.incarnation == it->second.incarnation &&
        VerdictNames(notice, SlotId::Unpack(accepted.slot))) {
      return accepted.job;
    }
  }
  return nullptr;
}

void TransferRegistry::Finished(const JobPtr& job, bool free_request_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (live_.erase(job->serial()) == 0) return;  // told once
  FL_CHECK(active_ > 0, "more transfers finished than were admitted");
  --active_;
  if (auto held = active_by_requester_.find(job->requester());
      held != active_by_requester_.end() && --held->second == 0) {
    active_by_requester_.erase(held);
  }
  const std::string& node = job->target_node();
  if (auto it = by_target_.find(node); it != by_target_.end()) {
    std::erase_if(it->second.jobs,
                  [&](const AcceptedJob& accepted) { return accepted.job == job; });
    if (it->second.jobs.empty()) by_target_.erase(it);
  }
  if (free_request_id) {
    auto it =
        by_request_.find(RequestKey(job->requester(), job->transfer()->request_id()));
    if (it != by_request_.end() && it->second.job == job) it->second.free = true;
  }
  finished_.emplace_back(now, job);
}

void TransferRegistry::Collect(absl::Time now) {
  std::vector<JobPtr> forgotten;  // destroyed with no lock held
  absl::MutexLock lock(&mu_);
  while (!finished_.empty() &&
         (finished_.size() > options_.max_finished_kept ||
          now - finished_.front().first >= options_.finished_kept_for)) {
    JobPtr job = std::move(finished_.front().second);
    finished_.pop_front();
    const std::shared_ptr<Transfer>& t = job->transfer();
    if (auto it = by_id_.find(t->id()); it != by_id_.end() && it->second == job) {
      by_id_.erase(it);
    }
    if (auto it = by_request_.find(RequestKey(job->requester(), t->request_id()));
        it != by_request_.end() && it->second.job == job) {
      by_request_.erase(it);
    }
    forgotten.push_back(std::move(job));
  }
}

bool TransferRegistry::Close() {
  absl::MutexLock lock(&mu_);
  return !std::exchange(closed_, true);
}

size_t TransferRegistry::active() const {
  absl::ReaderMutexLock lock(&mu_);
  return active_;
}

size_t TransferRegistry::kept() const {
  absl::ReaderMutexLock lock(&mu_);
  return by_id_.size();
}

uint64_t TransferRegistry::share_refusals() const {
  absl::ReaderMutexLock lock(&mu_);
  return share_refusals_;
}

}  // namespace fuselink::transfer
