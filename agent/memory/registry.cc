#include "agent/memory/registry.h"

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/memory/host_mapping.h"

namespace fuselink::memory {

struct TensorLease::Record {
  TensorInfo info;
  std::shared_ptr<HostMapping> mapping;
  fabric::RegionKey region_key = 0;
  std::atomic<int> leases{0};
};

void TensorLease::Release() {
  if (record_) record_->leases.fetch_sub(1, std::memory_order_acq_rel);
  record_.reset();
}

TensorLease& TensorLease::operator=(TensorLease&& other) noexcept {
  if (this != &other) {
    Release();
    record_ = std::move(other.record_);
  }
  return *this;
}
const TensorInfo& TensorLease::info() const { return record_->info; }
uint8_t* TensorLease::base() const {
  return static_cast<uint8_t*>(record_->mapping->data());
}
fabric::RegionKey TensorLease::region_key() const { return record_->region_key; }

namespace {

absl::Status UnknownTensor(absl::string_view name) {
  return WithReason(absl::NotFoundError(absl::StrCat("no tensor named '", name, "'")),
                    "UNKNOWN_TENSOR");
}

}  // namespace

absl::Status ValidateName(absl::string_view name) {
  bool ok = !name.empty() && name.size() <= kMaxNameBytes;
  for (char c : name) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '/' || c == '-');
  }
  if (ok) return absl::OkStatus();
  return WithReason(absl::InvalidArgumentError(absl::StrCat(
                        "tensor name '", name.substr(0, 160), "' must be 1 to ",
                        kMaxNameBytes, " characters of [A-Za-z0-9._/-]")),
                    "BAD_NAME");
}

absl::StatusOr<TensorInfo> Registry::RegisterHost(TensorInfo want, UniqueFd fd,
                                                  uint64_t offset_bytes,
                                                  uint64_t size_bytes) {
  FL_RETURN_IF_ERROR(ValidateName(want.name));
  FL_ASSIGN_OR_RETURN(want.layout, NormalizeLayout(want.layout, size_bytes));
  {
    absl::MutexLock lock(&mu_);
    if (tensors_.contains(want.name)) {
      return WithReason(absl::AlreadyExistsError(absl::StrCat(
                            "a tensor named '", want.name, "' is already registered")),
                        "TENSOR_EXISTS");
    }
    if (tensors_.size() >= kMaxTensors) {
      return WithReason(absl::ResourceExhaustedError(
                            absl::StrCat("already ", kMaxTensors, " tensors registered")),
                        "TOO_MANY_TENSORS");
    }
  }
  FL_ASSIGN_OR_RETURN(std::shared_ptr<HostMapping> mapping,
                      HostMapping::Map(std::move(fd), offset_bytes, size_bytes));
  auto record = std::make_shared<TensorLease::Record>();
  want.memory_kind = "host";
  want.size_bytes = size_bytes;
  record->info = std::move(want);
  record->mapping = mapping;
  FL_ASSIGN_OR_RETURN(record->region_key,
                      fabric_->RegisterRegion(mapping->data(), size_bytes, mapping));
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = tensors_.emplace(record->info.name, record);
  if (!inserted) {  // lost a race with a registration of the same name
    fabric_->DeregisterRegion(record->region_key).IgnoreError();
    return WithReason(
        absl::AlreadyExistsError(absl::StrCat("a tensor named '", record->info.name,
                                              "' is already registered")),
        "TENSOR_EXISTS");
  }
  return record->info;
}

absl::Status Registry::Unregister(absl::string_view name) {
  std::shared_ptr<TensorLease::Record> record;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return UnknownTensor(name);
    if (it->second->leases.load(std::memory_order_acquire) > 0) {
      return WithReason(absl::FailedPreconditionError(
                            absl::StrCat("tensor '", name,
                                         "' is in use by a transfer; cancel it or "
                                         "wait for it to finish")),
                        "TENSOR_IN_USE");
    }
    record = std::move(it->second);
    tensors_.erase(it);
  }
  return fabric_->DeregisterRegion(record->region_key);
}

absl::StatusOr<TensorInfo> Registry::Get(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return UnknownTensor(name);
  return it->second->info;
}

std::vector<TensorInfo> Registry::List(absl::string_view after, size_t limit,
                                       bool* more) const {
  std::vector<TensorInfo> out;
  absl::MutexLock lock(&mu_);
  auto it = after.empty() ? tensors_.begin() : tensors_.upper_bound(after);
  for (; it != tensors_.end() && out.size() < limit; ++it) {
    out.push_back(it->second->info);
  }
  *more = it != tensors_.end();
  return out;
}

absl::StatusOr<TensorLease> Registry::Acquire(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return UnknownTensor(name);
  it->second->leases.fetch_add(1, std::memory_order_acq_rel);
  return TensorLease(it->second);
}

size_t Registry::size() const {
  absl::MutexLock lock(&mu_);
  return tensors_.size();
}

}  // namespace fuselink::memory
