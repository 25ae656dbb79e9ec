#include "agent/memory/registry.h"

#include <poll.h>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/memory/host_mapping.h"

namespace fuselink::memory {

struct TensorLease::Record {
  TensorInfo info;
  uint64_t id = 0;
  uint8_t* base = nullptr;
  int gpu = -1;
  std::shared_ptr<const void> memory;  // the mapping or the GPU import
  fabric::RegionKey region_key = 0;
  UniqueFd owner;  // pidfd of the lending process; may be empty
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
uint8_t* TensorLease::base() const { return record_->base; }
int TensorLease::gpu() const { return record_->gpu; }
uint64_t TensorLease::id() const { return record_->id; }
fabric::RegionKey TensorLease::region_key() const { return record_->region_key; }

namespace {

absl::Status UnknownTensor(absl::string_view name) {
  return WithReason(absl::NotFoundError(
                        absl::StrCat("no tensor named '", BoundedForMessage(name), "'")),
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
                        "tensor name '", BoundedForMessage(name), "' must be 1 to ",
                        kMaxNameBytes, " characters of [A-Za-z0-9._/-]")),
                    "BAD_NAME");
}

absl::Status Registry::CheckRoom(const TensorInfo& want) const {
  FL_RETURN_IF_ERROR(ValidateName(want.name));
  absl::MutexLock lock(&mu_);
  if (tensors_.contains(want.name)) {
    return WithReason(
        absl::AlreadyExistsError(absl::StrCat(
            "a tensor named '", BoundedForMessage(want.name), "' is already registered")),
        "TENSOR_EXISTS");
  }
  if (tensors_.size() >= kMaxTensors) {
    return WithReason(absl::ResourceExhaustedError(
                          absl::StrCat("already ", kMaxTensors, " tensors registered")),
                      "TOO_MANY_TENSORS");
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorInfo> Registry::RegisterHost(TensorInfo want, UniqueFd fd,
                                                  uint64_t offset_bytes,
                                                  uint64_t size_bytes, UniqueFd owner) {
  FL_ASSIGN_OR_RETURN(want.layout, NormalizeLayout(want.layout, size_bytes));
  FL_RETURN_IF_ERROR(CheckRoom(want));
  FL_ASSIGN_OR_RETURN(std::shared_ptr<HostMapping> mapping,
                      HostMapping::Map(std::move(fd), offset_bytes, size_bytes));
  auto record = std::make_shared<TensorLease::Record>();
  want.memory_kind = "host";
  record->info = std::move(want);
  record->owner = std::move(owner);
  void* base = mapping->data();
  return Insert(std::move(record), base, size_bytes, -1, std::move(mapping));
}

absl::StatusOr<TensorInfo> Registry::RegisterGpu(TensorInfo want, uint64_t address,
                                                 int gpu, uint64_t size_bytes,
                                                 std::shared_ptr<const void> memory,
                                                 UniqueFd owner) {
  FL_ASSIGN_OR_RETURN(want.layout, NormalizeLayout(want.layout, size_bytes));
  FL_RETURN_IF_ERROR(CheckRoom(want));
  auto record = std::make_shared<TensorLease::Record>();
  want.home_gpu = static_cast<uint32_t>(gpu);
  record->info = std::move(want);
  record->owner = std::move(owner);
  return Insert(std::move(record), reinterpret_cast<void*>(address), size_bytes, gpu,
                std::move(memory));
}

absl::StatusOr<TensorInfo> Registry::Insert(std::shared_ptr<TensorLease::Record> record,
                                            void* base, uint64_t size_bytes, int gpu,
                                            std::shared_ptr<const void> memory) {
  record->info.size_bytes = size_bytes;
  record->id = next_id_.fetch_add(1, std::memory_order_relaxed);
  record->base = static_cast<uint8_t*>(base);
  record->gpu = gpu;
  record->memory = memory;
  if (gpu >= 0) {
    FL_ASSIGN_OR_RETURN(record->region_key, fabric_->RegisterDeviceRegion(
                                                reinterpret_cast<uintptr_t>(base),
                                                size_bytes, gpu, std::move(memory)));
  } else {
    FL_ASSIGN_OR_RETURN(record->region_key,
                        fabric_->RegisterRegion(base, size_bytes, std::move(memory)));
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = tensors_.emplace(record->info.name, record);
  if (!inserted) {  // lost a race with a registration of the same name
    fabric_->DeregisterRegion(record->region_key).IgnoreError();
    return WithReason(absl::AlreadyExistsError(absl::StrCat(
                          "a tensor named '", BoundedForMessage(record->info.name),
                          "' is already registered")),
                      "TENSOR_EXISTS");
  }
  return record->info;
}

std::vector<Revoked> Registry::TakeExitedOwners() {
  std::vector<Revoked> out;
  absl::MutexLock lock(&mu_);
  // One poll over every owner: a pidfd polls readable once its process has exited.
  std::vector<pollfd> owners;
  for (const auto& [name, record] : tensors_) {
    if (record->owner.get() >= 0) owners.push_back({record->owner.get(), POLLIN, 0});
  }
  if (owners.empty() || poll(owners.data(), owners.size(), 0) <= 0) return out;
  std::vector<int> exited;
  for (const pollfd& p : owners) {
    if (p.revents != 0) exited.push_back(p.fd);
  }
  for (auto it = tensors_.begin(); it != tensors_.end();) {
    const TensorLease::Record& r = *it->second;
    if (r.owner.get() >= 0 && absl::c_linear_search(exited, r.owner.get())) {
      out.push_back(Revoked{it->first, r.id, r.region_key});
      it = tensors_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

absl::Status Registry::Unregister(
    absl::string_view name, absl::FunctionRef<absl::Status(const TensorInfo&)> check) {
  std::shared_ptr<TensorLease::Record> record;
  {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return UnknownTensor(name);
    FL_RETURN_IF_ERROR(check(it->second->info));
    if (it->second->leases.load(std::memory_order_acquire) > 0) {
      return WithReason(absl::FailedPreconditionError(
                            absl::StrCat("tensor '", BoundedForMessage(name),
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
