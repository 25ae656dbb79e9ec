#include "tests/transfer/fakes.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "agent/common/status_macros.h"
#include "agent/common/unique_fd.h"
#include "agent/transfer/imm.h"

namespace fuselink::transfer::testing {

// --- FakeFabric ---

void FakeFabric::FailPosts(int nic, absl::Status status, int count) {
  absl::MutexLock lock(&mu_);
  failures_.push_back(Failure{nic, std::move(status), count});
}

void FakeFabric::ClearPostFailures() {
  absl::MutexLock lock(&mu_);
  failures_.clear();
}

std::vector<Posted> FakeFabric::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_;
}

size_t FakeFabric::pending_count() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

std::vector<Posted> FakeFabric::Take() {
  absl::MutexLock lock(&mu_);
  return std::exchange(pending_, {});
}

std::vector<Posted> FakeFabric::history() const {
  absl::MutexLock lock(&mu_);
  return history_;
}

size_t FakeFabric::posts() const {
  absl::MutexLock lock(&mu_);
  return posts_;
}

size_t FakeFabric::refused_posts() const {
  absl::MutexLock lock(&mu_);
  return refused_posts_;
}

bool FakeFabric::WaitForPending(size_t count, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return pending_.size() >= count; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

void FakeFabric::Complete(const Posted& write, absl::Status status) {
  on_completion_(fabric::Completion{.wr_id = write.op.wr_id,
                                    .nic = write.nic,
                                    .bytes = write.op.bytes,
                                    .status = std::move(status)});
}

void FakeFabric::Refuse(const Posted& write, fabric::Refusal refusal) {
  on_completion_(fabric::Completion{.wr_id = write.op.wr_id,
                                    .nic = write.nic,
                                    .bytes = write.op.bytes,
                                    .status = fabric::RefusalStatus(refusal),
                                    .refusal = refusal});
}

size_t FakeFabric::CompleteAll(int max_rounds) {
  size_t done = 0;
  for (int round = 0; round < max_rounds; ++round) {
    std::vector<Posted> writes = Take();
    if (writes.empty()) break;
    for (const Posted& w : writes) Complete(w);
    done += writes.size();
  }
  return done;
}

void FakeFabric::Disconnect(fabric::PeerId peer) {
  absl::MutexLock lock(&mu_);
  disconnects_.push_back(peer);
}

std::vector<fabric::PeerId> FakeFabric::disconnects() const {
  absl::MutexLock lock(&mu_);
  return disconnects_;
}

size_t FakeFabric::FlushAll() {
  std::vector<Posted> writes = Take();
  for (const Posted& w : writes) {
    Complete(w, absl::UnavailableError("connection lost: the fabric is closing"));
  }
  return writes.size();
}

absl::StatusOr<fabric::RegionKey> FakeFabric::RegisterRegion(
    void* base, uint64_t bytes, std::shared_ptr<const void> keepalive) {
  absl::MutexLock lock(&mu_);
  return next_key_++;
}

absl::StatusOr<fabric::RegionKey> FakeFabric::RegisterDeviceRegion(
    uint64_t address, uint64_t bytes, int gpu, std::shared_ptr<const void> keepalive) {
  absl::MutexLock lock(&mu_);
  return next_key_++;
}

absl::Status FakeFabric::DeregisterRegion(fabric::RegionKey key) {
  return absl::OkStatus();
}

absl::StatusOr<fabric::WindowKey> FakeFabric::OpenWindow(
    fabric::RegionKey region, absl::string_view peer_name,
    std::span<const fabric::Extent> extents) {
  absl::MutexLock lock(&mu_);
  return next_key_++;
}

void FakeFabric::CloseWindow(fabric::WindowKey window,
                             absl::AnyInvocable<void() &&> drained) {
  std::move(drained)();
}

absl::StatusOr<fabric::PeerId> FakeFabric::Connect(
    absl::string_view peer_name, const std::vector<fabric::Endpoint>& remote) {
  return 1;
}

absl::Status FakeFabric::PostWrite(fabric::PeerId peer, int nic,
                                   const fabric::WriteOp& op) {
  absl::MutexLock lock(&mu_);
  for (auto it = failures_.begin(); it != failures_.end(); ++it) {
    if (it->nic != -1 && it->nic != nic) continue;
    absl::Status status = it->status;
    if (it->count > 0 && --it->count == 0) failures_.erase(it);
    ++refused_posts_;
    return status;
  }
  ++posts_;
  pending_.push_back(Posted{peer, nic, op});
  history_.push_back(pending_.back());
  return absl::OkStatus();
}

// --- FakePeerLink ---

FakePeerLink::FakePeerLink() : prepared_(absl::UnknownError("no answer scripted")) {}

void FakePeerLink::AddNode(const std::string& node) {
  absl::MutexLock lock(&mu_);
  nodes_.insert(node);
}

bool FakePeerLink::Knows(absl::string_view node) const {
  absl::MutexLock lock(&mu_);
  return nodes_.contains(std::string(node));
}

absl::StatusOr<Prepared> FakePeerLink::PrepareIncoming(const IncomingSpec& spec) {
  absl::MutexLock lock(&mu_);
  specs_.push_back(spec);
  auto released = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !blocked_ && !blocked_targets_.contains(spec.target_node);
  };
  mu_.Await(absl::Condition(&released));
  ++prepares_returned_;
  if (!prepared_.ok()) return prepared_;
  // Each accepted transfer gets a slot of its own: 5, 6, 7, ...
  Prepared p = *prepared_;
  p.slot = SlotId{SlotId::Unpack(p.slot).index + static_cast<uint32_t>(specs_.size()) - 1,
                  SlotId::Unpack(p.slot).generation}
               .Pack();
  return p;
}

absl::StatusOr<std::optional<absl::Status>> FakePeerLink::QueryVerdict(
    absl::string_view target_node, absl::string_view transfer_id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  ++queries_;
  if (replies_.empty()) {
    return WithReason(absl::NotFoundError("no such transfer"), reasons::kUnknownTransfer);
  }
  const Reply reply = replies_.front();
  replies_.pop_front();
  if (!reply.error.ok()) return reply.error;
  return reply.verdict;
}

void FakePeerLink::set_prepared(absl::StatusOr<Prepared> prepared) {
  absl::MutexLock lock(&mu_);
  prepared_ = std::move(prepared);
}

void FakePeerLink::Block() {
  absl::MutexLock lock(&mu_);
  blocked_ = true;
}

void FakePeerLink::Release() {
  absl::MutexLock lock(&mu_);
  blocked_ = false;
}

void FakePeerLink::Block(const std::string& target) {
  absl::MutexLock lock(&mu_);
  blocked_targets_.insert(target);
}

void FakePeerLink::Release(const std::string& target) {
  absl::MutexLock lock(&mu_);
  blocked_targets_.erase(target);
}

void FakePeerLink::AddReply(absl::StatusOr<std::optional<absl::Status>> reply) {
  absl::MutexLock lock(&mu_);
  replies_.push_back(reply.ok() ? Reply{absl::OkStatus(), *reply}
                                : Reply{reply.status(), {}});
}

std::vector<IncomingSpec> FakePeerLink::specs() const {
  absl::MutexLock lock(&mu_);
  return specs_;
}

int FakePeerLink::queries() const {
  absl::MutexLock lock(&mu_);
  return queries_;
}

int FakePeerLink::prepares_returned() const {
  absl::MutexLock lock(&mu_);
  return prepares_returned_;
}

bool FakePeerLink::WaitForPrepares(int count, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return static_cast<int>(specs_.size()) >= count;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

int FakePeerLink::prepares_of(const std::string& target) const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(
      std::count_if(specs_.begin(), specs_.end(),
                    [&](const IncomingSpec& s) { return s.target_node == target; }));
}

bool FakePeerLink::WaitForPreparesOf(const std::string& target, int count,
                                     absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return std::count_if(specs_.begin(), specs_.end(), [&](const IncomingSpec& s) {
             return s.target_node == target;
           }) >= count;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

bool FakePeerLink::WaitForQueries(int count, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return queries_ >= count; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

// --- FakeRelayPool ---

FakeRelayPool::FakeRelayPool(int nics, uint32_t slots, uint32_t cap) : max_cap_(cap) {
  absl::MutexLock lock(&mu_);
  cap_ = cap;
  free_.resize(nics);
  made_.assign(nics, slots);
  for (int k = 0; k < nics; ++k) {
    for (uint32_t i = 0; i < slots; ++i) free_[k].push_back(i);
  }
  for (uint32_t i = 0; i < uint32_t(nics) * cap; ++i) {
    fences_.push_back(std::make_unique<FakeFence>(this));
  }
}

FakeRelayPool::~FakeRelayPool() = default;

relay::Slot FakeRelayPool::TryAcquire(int nic) {
  absl::MutexLock lock(&mu_);
  if (free_[nic].empty()) return relay::Slot{};
  const uint32_t index = free_[nic].back();
  free_[nic].pop_back();
  ++in_use_;
  return relay::Slot{nic,
                     index,
                     nullptr,
                     1000u + nic,
                     uint64_t{index} << 20,
                     fences_[nic * max_cap_ + index].get()};
}

bool FakeRelayPool::Grow(int nic) {
  absl::MutexLock lock(&mu_);
  if (made_[nic] >= cap_) return false;
  free_[nic].push_back(made_[nic]++);
  ++grown_;
  return true;
}

void FakeRelayPool::Release(const relay::Slot& slot) {
  absl::MutexLock lock(&mu_);
  free_[slot.nic].push_back(slot.index);
  --in_use_;
}

absl::Status FakeRelayPool::Stage(const relay::Slot& slot, relay::Source source,
                                  uint32_t bytes) {
  absl::MutexLock lock(&mu_);
  ++staged_;
  return absl::OkStatus();
}

absl::Status FakeRelayPool::FakeFence::Wait() {
  absl::MutexLock lock(&pool->mu_);
  pool->waiters_.push_back(std::this_thread::get_id());
  return absl::OkStatus();
}

void FakeRelayPool::SetCap(uint32_t cap) {
  absl::MutexLock lock(&mu_);
  cap_ = std::min(cap, max_cap_);
}

int FakeRelayPool::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

int FakeRelayPool::staged() const {
  absl::MutexLock lock(&mu_);
  return staged_;
}

int FakeRelayPool::grown() const {
  absl::MutexLock lock(&mu_);
  return grown_;
}

std::vector<std::thread::id> FakeRelayPool::fence_waiters() const {
  absl::MutexLock lock(&mu_);
  return waiters_;
}

bool FakeRelayPool::WaitForReleases(int in_use, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return in_use_ <= in_use; };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

// --- Tensors and requests ---

absl::StatusOr<memory::TensorInfo> RegisterHostTensor(memory::Registry& registry,
                                                      const std::string& name,
                                                      const memory::Layout& layout,
                                                      uint32_t home_gpu) {
  const uint64_t bytes =
      (uint64_t{layout.layers} * layout.blocks_per_layer * layout.block_bytes + 4095) /
      4096 * 4096;
  UniqueFd fd(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd.get() < 0) return ErrnoStatus("memfd_create", errno);
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus("ftruncate", errno);
  }
  memory::TensorInfo want;
  want.name = name;
  want.layout = layout;
  want.home_gpu = home_gpu;
  return registry.RegisterHost(want, std::move(fd), 0, bytes);
}

absl::StatusOr<memory::TensorInfo> RegisterGpuTensor(memory::Registry& registry,
                                                     const std::string& name,
                                                     const memory::Layout& layout,
                                                     int gpu) {
  const uint64_t bytes =
      uint64_t{layout.layers} * layout.blocks_per_layer * layout.block_bytes;
  memory::TensorInfo want;
  want.name = name;
  want.layout = layout;
  want.home_gpu = static_cast<uint32_t>(gpu);
  want.memory_kind = "vmm";
  return registry.RegisterGpu(want, /*address=*/0x7f0000000000ull, gpu, bytes,
                              std::make_shared<int>(0));
}

v1::TransferRequest MakeRequest(const std::string& request_id, const std::string& source,
                                std::vector<uint32_t> source_blocks,
                                const std::string& target,
                                std::vector<uint32_t> target_blocks) {
  v1::TransferRequest request;
  request.set_request_id(request_id);
  request.mutable_source()->set_node("node-a");
  request.mutable_source()->set_tensor(source);
  *request.mutable_source()->mutable_block_ids() = {source_blocks.begin(),
                                                    source_blocks.end()};
  request.mutable_target()->set_node("node-b");
  request.mutable_target()->set_tensor(target);
  *request.mutable_target()->mutable_block_ids() = {target_blocks.begin(),
                                                    target_blocks.end()};
  return request;
}

Prepared MakePrepared(const memory::Layout& layout, uint32_t idle_mask) {
  Prepared p;
  p.peer = 1;
  p.windows = {77};
  p.layout = layout;
  p.slot = SlotId{5, 300}.Pack();
  p.idle_nic_mask = idle_mask;
  return p;
}

}  // namespace fuselink::transfer::testing
