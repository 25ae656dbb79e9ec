#include "agent/memory/registry.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "agent/common/options.h"
#include "agent/common/status_macros.h"
#include "agent/memory/host_mapping.h"

namespace fuselink::memory {

absl::Status OwnerShares::Validate() const {
  FL_RETURN_IF_ERROR(InRange<size_t>("max_tensors", max_tensors, 1, kMaxTensors));
  return AtLeast<size_t>("max_layout_parts", max_layout_parts, 1);
}

struct TensorLease::Record {
  TensorInfo info;
  uint64_t id = 0;
  std::vector<Region> regions;
  // The mappings or GPU imports: a leased tensor's memory stays mapped, whatever the
  // fabric has let go of (a revoked tensor's regions are deregistered while a relay
  // copy may still read it).
  std::vector<std::shared_ptr<const void>> memory;
  int gpu = -1;
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
const std::vector<Region>& TensorLease::regions() const { return record_->regions; }
int TensorLease::gpu() const { return record_->gpu; }
uint64_t TensorLease::id() const { return record_->id; }

namespace {

absl::Status UnknownTensor(absl::string_view name) {
  return WithReason(absl::NotFoundError(
                        absl::StrCat("no tensor named '", BoundedForMessage(name), "'")),
                    reasons::kUnknownTensor);
}

// INVALID_ARGUMENT (BAD_OWNER_FD) unless `fd` is a pidfd. Signal 0 sends nothing; the
// kernel answers EBADF only for a descriptor that is no pidfd (EPERM, ESRCH or EINVAL
// still name a process: one we may not signal, one that exited, one in a pid namespace
// out of reach). Anything else polls readable at once or never, so the tensor would
// be revoked at the next poll or never, silently.
absl::Status CheckOwnerPidfd(const UniqueFd& fd) {
  if (!fd.valid()) return absl::OkStatus();
  if (syscall(SYS_pidfd_send_signal, fd.get(), 0, nullptr, 0) == 0 || errno != EBADF) {
    return absl::OkStatus();
  }
  return WithReason(absl::InvalidArgumentError(
                        "owner_fd_token names a descriptor that is not a pidfd: pass "
                        "pidfd_open(getpid(), 0) of the lending process"),
                    reasons::kBadOwnerFd);
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
                    reasons::kBadName);
}

absl::Status Registry::CheckRoom(const TensorInfo& want) const {
  FL_RETURN_IF_ERROR(ValidateName(want.name));
  absl::MutexLock lock(&mu_);
  if (tensors_.contains(want.name)) {
    return WithReason(
        absl::AlreadyExistsError(absl::StrCat(
            "a tensor named '", BoundedForMessage(want.name), "' is already registered")),
        reasons::kTensorExists);
  }
  if (tensors_.size() >= kMaxTensors) {
    return WithReason(absl::ResourceExhaustedError(
                          absl::StrCat("already ", kMaxTensors, " tensors registered")),
                      reasons::kTooManyTensors);
  }
  return CheckShareLocked(want);
}

absl::Status Registry::CheckShareLocked(const TensorInfo& want) const {
  size_t tensors = 0, layout_parts = 0;
  if (auto it = holdings_.find(want.owner); it != holdings_.end()) {
    tensors = it->second.tensors.size();
    layout_parts = it->second.layout_parts;
  }
  const std::string who = want.owner.empty()
                              ? std::string("every caller (open access)")
                              : absl::StrCat("'", BoundedForMessage(want.owner), "'");
  if (tensors >= shares_.max_tensors) {
    tensor_share_refusals_.fetch_add(1, std::memory_order_relaxed);
    return WithReason(absl::ResourceExhaustedError(absl::StrCat(
                          who, " already holds ", tensors, " tensors, its share ",
                          "(--max_tensors_per_engine); unregister some first")),
                      reasons::kTensorShare);
  }
  // At most kMaxTensors x kMaxLayoutParts: no overflow.
  if (layout_parts + want.layout.parts.size() > shares_.max_layout_parts) {
    layout_part_share_refusals_.fetch_add(1, std::memory_order_relaxed);
    return WithReason(
        absl::ResourceExhaustedError(absl::StrCat(
            who, " holds ", layout_parts, " layout parts; ", want.layout.parts.size(),
            " more would pass its share of ", shares_.max_layout_parts,
            " (--max_layout_parts_per_engine); unregister some first")),
        reasons::kLayoutPartShare);
  }
  return absl::OkStatus();
}

Registry::Records::iterator Registry::EraseLocked(Records::iterator it) {
  const TensorInfo& info = it->second->info;
  auto holding = holdings_.find(info.owner);
  holding->second.tensors.erase(info.name);
  holding->second.layout_parts -= info.layout.parts.size();
  if (holding->second.tensors.empty()) holdings_.erase(holding);
  return tensors_.erase(it);
}

absl::StatusOr<TensorInfo> Registry::RegisterHost(TensorInfo want, UniqueFd fd,
                                                  uint64_t offset_bytes,
                                                  uint64_t size_bytes, UniqueFd owner) {
  FL_ASSIGN_OR_RETURN(want.layout, NormalizeLayout(want.layout, size_bytes));
  FL_RETURN_IF_ERROR(CheckRoom(want));
  FL_ASSIGN_OR_RETURN(std::shared_ptr<HostMapping> mapping,
                      HostMapping::Map(std::move(fd), offset_bytes, size_bytes));
  want.memory_kind = "host";
  std::vector<RegionMemory> regions;
  regions.push_back({.base = static_cast<uint8_t*>(mapping->data()),
                     .bytes = size_bytes,
                     .keepalive = mapping,
                     .extent = {}});
  return Register(std::move(want), std::move(regions), -1, std::move(owner));
}

absl::StatusOr<TensorInfo> Registry::RegisterGpu(TensorInfo want, uint64_t address,
                                                 int gpu, uint64_t size_bytes,
                                                 std::shared_ptr<const void> memory,
                                                 UniqueFd owner) {
  std::vector<RegionMemory> regions;
  regions.push_back({.base = reinterpret_cast<uint8_t*>(address),
                     .bytes = size_bytes,
                     .keepalive = std::move(memory),
                     .extent = {}});
  return Register(std::move(want), std::move(regions), gpu, std::move(owner));
}

void Registry::Deregister(const std::vector<Region>& regions) {
  for (const Region& r : regions) fabric_->DeregisterRegion(r.key).IgnoreError();
}

absl::StatusOr<TensorInfo> Registry::Register(TensorInfo want,
                                              std::vector<RegionMemory> regions, int gpu,
                                              UniqueFd owner) {
  FL_RETURN_IF_ERROR(CheckOwnerPidfd(owner));
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const RegionMemory& r : regions) {
    if (r.bytes > kMaxRegionBytes) {
      return WithReason(
          absl::InvalidArgumentError(absl::StrCat("a memory region of ", r.bytes,
                                                  " bytes; at most ", kMaxRegionBytes)),
          reasons::kBadMemory);
    }
    sizes.push_back(r.bytes);
    total += r.bytes;  // at most kMaxRegions of them: no overflow
  }
  FL_ASSIGN_OR_RETURN(want.layout, NormalizeLayout(std::move(want.layout), sizes));
  want.memory.clear();
  for (const RegionMemory& r : regions) {
    want.memory.push_back(r.extent.bytes != 0
                              ? r.extent
                              : MemoryExtent{.begin = reinterpret_cast<uintptr_t>(r.base),
                                             .bytes = r.bytes});
  }
  // The layout keeps a tensor's parts apart by region index; two regions that are one
  // memory (a memfd lent twice) would put one byte in two parts.
  if (auto shared = SharedWithin(want.memory)) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(
            "regions ", shared->first, " and ", shared->second,
            " are the same memory (one file's bytes, or one GPU allocation's, lent "
            "twice): no byte of a tensor may be in two of its regions")),
        reasons::kAliasedRegions);
  }
  FL_RETURN_IF_ERROR(CheckRoom(want));
  auto record = std::make_shared<TensorLease::Record>();
  if (gpu >= 0) want.home_gpu = static_cast<uint32_t>(gpu);
  want.size_bytes = total;
  want.region_bytes = std::move(sizes);
  record->info = std::move(want);
  record->owner = std::move(owner);
  record->id = next_id_.fetch_add(1, std::memory_order_relaxed);
  record->gpu = gpu;
  for (RegionMemory& r : regions) {
    record->memory.push_back(r.keepalive);
    absl::StatusOr<fabric::RegionKey> key =
        gpu >= 0 ? fabric_->RegisterDeviceRegion(reinterpret_cast<uintptr_t>(r.base),
                                                 r.bytes, gpu, std::move(r.keepalive))
                 : fabric_->RegisterRegion(r.base, r.bytes, std::move(r.keepalive));
    if (!key.ok()) {
      Deregister(record->regions);
      return key.status();
    }
    record->regions.push_back(Region{r.base, r.bytes, *key});
  }
  absl::MutexLock lock(&mu_);
  // Checked again: registrations of the same owner may have raced past CheckRoom.
  if (absl::Status share = CheckShareLocked(record->info); !share.ok()) {
    Deregister(record->regions);
    return share;
  }
  auto [it, inserted] = tensors_.emplace(record->info.name, record);
  if (!inserted) {  // lost a race with a registration of the same name
    Deregister(record->regions);
    return WithReason(absl::AlreadyExistsError(absl::StrCat(
                          "a tensor named '", BoundedForMessage(record->info.name),
                          "' is already registered")),
                      reasons::kTensorExists);
  }
  Holding& holding = holdings_[record->info.owner];
  holding.tensors.emplace(record->info.name, record);
  holding.layout_parts += record->info.layout.parts.size();
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
      std::vector<fabric::RegionKey> keys;
      for (const Region& region : r.regions) keys.push_back(region.key);
      out.push_back(Revoked{it->first, r.id, std::move(keys)});
      it = EraseLocked(it);
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
                        reasons::kTensorInUse);
    }
    record = it->second;
    EraseLocked(it);
  }
  absl::Status status;
  for (const Region& r : record->regions) status.Update(fabric_->DeregisterRegion(r.key));
  return status;
}

absl::StatusOr<TensorInfo> Registry::Get(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return UnknownTensor(name);
  return it->second->info;
}

std::vector<std::shared_ptr<const TensorInfo>> Registry::List(
    absl::string_view after, size_t limit, bool* more,
    std::optional<absl::string_view> owner) const {
  std::vector<std::shared_ptr<const TensorInfo>> out;
  out.reserve(limit);
  absl::MutexLock lock(&mu_);
  const Records* records = &tensors_;
  if (owner.has_value()) {
    auto holding = holdings_.find(*owner);
    *more = false;
    if (holding == holdings_.end()) return out;
    records = &holding->second.tensors;
  }
  auto it = after.empty() ? records->begin() : records->upper_bound(after);
  for (; it != records->end() && out.size() < limit; ++it) {
    // Shares the record's ownership: the info outlives an unregistration meanwhile.
    out.emplace_back(it->second, &it->second->info);
  }
  *more = it != records->end();
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

void Registry::ReportStats(stats::Sink& sink) const {
  static constexpr stats::Family kRegistered{"fuselink_tensors_registered",
                                             "Tensors registered on this node.",
                                             stats::Kind::kGauge};
  sink.Add(kRegistered, static_cast<double>(size()));
  const ShareRefusals refused = share_refusals();
  sink.Add(stats::kShareRefusals, {{"reason", "TENSOR_SHARE"}},
           static_cast<double>(refused.tensors));
  sink.Add(stats::kShareRefusals, {{"reason", "LAYOUT_PART_SHARE"}},
           static_cast<double>(refused.layout_parts));
}

}  // namespace fuselink::memory
