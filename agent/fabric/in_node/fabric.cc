#include "agent/fabric/in_node/fabric.h"

#include <cstring>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"

namespace fuselink::fabric {

InNodeFabric::InNodeFabric(std::unique_ptr<Fabric> wrapped, Handler* handler,
                           InNodeOptions options)
    : wrapped_(std::move(wrapped)), handler_(handler), options_(std::move(options)) {
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    std::unique_ptr<DeviceCopier> copier;
    if (options_.copier) {
      absl::StatusOr<std::unique_ptr<DeviceCopier>> made = options_.copier();
      if (made.ok()) copier = std::move(*made);  // else its GPU copies fail
    }
    workers_.emplace_back(
        [this, c = std::move(copier)]() mutable { Work(std::move(c)); });
  }
}

InNodeFabric::~InNodeFabric() {
  std::deque<Queued> left;
  {
    absl::MutexLock lock(&queue_mu_);
    stopping_ = true;
    queue_cv_.SignalAll();
  }
  for (std::thread& t : workers_) t.join();
  {
    absl::MutexLock lock(&queue_mu_);
    left.swap(queue_);
  }
  for (const Queued& q : left) {
    handler_->OnCompletion(
        Completion{.wr_id = q.op.wr_id,
                   .nic = 0,
                   .bytes = q.op.bytes,
                   .status = absl::UnavailableError("the in-node lane stopped")});
  }
  // The wrapped fabric flushes its own writes into the handler while this one's
  // tables still exist.
  wrapped_.reset();
}

namespace {

// A failed GPU copy, as its write completes.
absl::Status CopyFailed(const absl::Status& why) {
  return WithReason(
      absl::InternalError(absl::StrCat("in-node copy: ", why.message().substr(0, 256))),
      reasons::kLocalCopy);
}

}  // namespace

RegionKey InNodeFabric::Mirror(RegionKey key, uint8_t* base, uint64_t bytes, int gpu,
                               std::shared_ptr<const void> keepalive) {
  auto region = std::make_shared<Region>();
  region->base = base;
  region->bytes = bytes;
  region->keepalive = std::move(keepalive);
  region->gpu = gpu;
  absl::MutexLock lock(&regions_mu_);
  regions_[key] = std::move(region);
  return key;
}

absl::StatusOr<RegionKey> InNodeFabric::RegisterRegion(
    void* base, uint64_t bytes, std::shared_ptr<const void> keepalive) {
  FL_ASSIGN_OR_RETURN(RegionKey key, wrapped_->RegisterRegion(base, bytes, keepalive));
  return Mirror(key, static_cast<uint8_t*>(base), bytes, -1, std::move(keepalive));
}

absl::StatusOr<RegionKey> InNodeFabric::RegisterDeviceRegion(
    uint64_t address, uint64_t bytes, int gpu, std::shared_ptr<const void> keepalive) {
  FL_ASSIGN_OR_RETURN(RegionKey key,
                      wrapped_->RegisterDeviceRegion(address, bytes, gpu, keepalive));
  return Mirror(key, reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(address)), bytes,
                gpu, std::move(keepalive));
}

absl::Status InNodeFabric::DeregisterRegion(RegionKey key) {
  {
    absl::MutexLock lock(&regions_mu_);
    regions_.erase(key);  // open windows and queued writes hold theirs
  }
  return wrapped_->DeregisterRegion(key);
}

absl::StatusOr<WindowKey> InNodeFabric::OpenWindow(RegionKey region,
                                                   absl::string_view peer_name,
                                                   std::span<const Extent> extents) {
  if (peer_name != options_.node) {
    for (;;) {
      FL_ASSIGN_OR_RETURN(WindowKey key,
                          wrapped_->OpenWindow(region, peer_name, extents));
      absl::MutexLock lock(&keys_mu_);
      if (!own_windows_.contains(key)) {
        wrapped_windows_.insert(key);
        return key;
      }
      wrapped_->CloseWindow(key, [] {});  // nothing was written through it yet
    }
  }
  std::shared_ptr<const Region> memory;
  {
    absl::MutexLock lock(&regions_mu_);
    auto it = regions_.find(region);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("no region ", region));
    }
    memory = it->second;
  }
  for (;;) {
    FL_ASSIGN_OR_RETURN(WindowKey key, windows_.Open(memory, peer_name, extents));
    absl::MutexLock lock(&keys_mu_);
    if (!wrapped_windows_.contains(key)) {
      own_windows_.insert(key);
      return key;
    }
    windows_.Close(key, [] {});
  }
}

void InNodeFabric::CloseWindow(WindowKey window, absl::AnyInvocable<void() &&> drained) {
  bool own;
  {
    absl::MutexLock lock(&keys_mu_);
    own = own_windows_.erase(window) > 0;
    if (!own) wrapped_windows_.erase(window);
  }
  if (own) {
    windows_.Close(window, std::move(drained));
  } else {
    wrapped_->CloseWindow(window, std::move(drained));
  }
}

absl::StatusOr<PeerId> InNodeFabric::Connect(absl::string_view peer_name,
                                             const std::vector<Endpoint>& remote) {
  if (peer_name == options_.node) return kSelf;
  return wrapped_->Connect(peer_name, remote);
}

void InNodeFabric::Disconnect(PeerId peer) {
  if (peer != kSelf) wrapped_->Disconnect(peer);
}

std::string InNodeFabric::PeerName(PeerId peer) const {
  return peer == kSelf ? options_.node : wrapped_->PeerName(peer);
}

std::optional<PeerId> InNodeFabric::FindPeer(absl::string_view name) const {
  if (name == options_.node) return kSelf;
  return wrapped_->FindPeer(name);
}

absl::Status InNodeFabric::PostWrite(PeerId peer, int nic, const WriteOp& op) {
  if (peer != kSelf) return wrapped_->PostWrite(peer, nic, op);
  if (nic != 0) {
    return absl::UnavailableError(absl::StrCat("the in-node lane has no NIC ", nic));
  }
  Queued write{op, nullptr};
  if (op.bytes > 0) {
    absl::MutexLock lock(&regions_mu_);
    auto it = regions_.find(op.local_key);
    if (it == regions_.end() ||
        !ExtentFits(op.local_offset, op.bytes, it->second->bytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("source extent outside region ", op.local_key));
    }
    write.source = it->second;
  }
  absl::MutexLock lock(&queue_mu_);
  if (stopping_) return absl::UnavailableError("the in-node lane stopped");
  if (op.bytes > 0) {
    if (queued_data_ >= options_.queue_depth) {
      return absl::ResourceExhaustedError("the in-node lane's queue is full");
    }
    ++queued_data_;
  }
  queue_.push_back(std::move(write));
  queue_cv_.Signal();
  return absl::OkStatus();
}

InNodeCounters InNodeFabric::in_node_counters() const {
  return InNodeCounters{host_bytes_.load(), device_bytes_.load(), refused_.load(),
                        failed_.load()};
}

void InNodeFabric::Work(std::unique_ptr<DeviceCopier> copier) {
  NameThisThread("fl-in-node");
  std::vector<Queued> batch;
  for (;;) {
    batch.clear();
    {
      absl::MutexLock lock(&queue_mu_);
      while (queue_.empty() && !stopping_) queue_cv_.Wait(&queue_mu_);
      if (stopping_) return;  // the destructor completes what is left
      while (!queue_.empty() && batch.size() < kBatch) {
        if (queue_.front().op.bytes > 0) --queued_data_;
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (absl::IsDeadlineExceeded(LandBatch(batch, copier.get()))) {
      // Spent: a new one, while the old keeps what its late copies may touch.
      absl::StatusOr<std::unique_ptr<DeviceCopier>> made = options_.copier();
      copier = made.ok() ? *std::move(made) : nullptr;
    }
  }
}

absl::Status InNodeFabric::LandBatch(std::vector<Queued>& batch, DeviceCopier* copier) {
  std::vector<Pending> landings;
  landings.reserve(batch.size());
  bool device = false;
  for (const Queued& write : batch) {
    const WriteOp& op = write.op;
    Pending& l = landings.emplace_back(
        Pending{&write,
                Completion{.wr_id = op.wr_id, .nic = 0, .bytes = op.bytes, .status = {}},
                {}});
    if (op.bytes == 0) continue;  // a notice
    std::variant<WindowTable::Placement, Refusal> admitted =
        windows_.Admit(op.remote_key, options_.node, op.remote_offset, op.bytes);
    if (const Refusal* refusal = std::get_if<Refusal>(&admitted)) {
      refused_.fetch_add(1);
      l.done.status = RefusalStatus(*refusal);
      l.done.refusal = *refusal;
      continue;
    }
    l.placement = std::move(std::get<WindowTable::Placement>(admitted));
    if (op.after != nullptr) l.done.status = op.after->Wait();
    if (l.done.status.ok()) {
      l.done.status = Start(l.placement.region(), op.remote_offset, *write.source,
                            op.local_offset, op.bytes, copier, &device);
    }
    l.placed = l.done.status.ok();
  }
  // The GPU copies of the batch went out together: one wait for all of them.
  absl::Status copied = absl::OkStatus();
  if (device) {
    copied = copier->Wait();
    // A timeout keeps its own reason; other failures are the lane's.
    if (!copied.ok() && !absl::IsDeadlineExceeded(copied)) copied = CopyFailed(copied);
  }
  for (Pending& l : landings) Finish(l, copied, copier);
  return copied;
}

void InNodeFabric::Finish(Pending& l, const absl::Status& copied, DeviceCopier* copier) {
  const WriteOp& op = l.write->op;
  const bool on_gpu =
      l.placed && (l.placement.region().on_gpu() || l.write->source->on_gpu());
  if (on_gpu && !copied.ok()) {
    if (absl::IsDeadlineExceeded(copied)) {
      copier->KeepWhileBusy(l.write->source);
      copier->KeepWhileBusy(l.placement.shared_region());
    }
    l.done.status = copied;
    l.placed = false;
  }
  if (op.bytes > 0 && !l.placed && l.done.refusal == Refusal::kNone) {
    failed_.fetch_add(1);
  }
  if (l.placed) (on_gpu ? device_bytes_ : host_bytes_).fetch_add(op.bytes);
  if (op.bytes == 0 || l.placed) {
    // Told while the window still counts the write as placing: the landing hears
    // of the bytes before anyone hears the window drained.
    handler_->OnArrival(Arrival{.peer = kSelf,
                                .peer_name = options_.node,
                                .nic = 0,
                                .window = op.bytes > 0 ? op.remote_key : 0,
                                .offset = op.remote_offset,
                                .bytes = op.bytes,
                                .imm = op.imm});
  }
  l.placement = WindowTable::Placement();
  handler_->OnCompletion(l.done);
}

absl::Status InNodeFabric::Start(const Region& to, uint64_t to_offset, const Region& from,
                                 uint64_t from_offset, uint32_t bytes,
                                 DeviceCopier* copier, bool* device) {
  const Place target{to.base + to_offset, to.gpu};
  const Place source{from.base + from_offset, from.gpu};
  if (!to.on_gpu() && !from.on_gpu()) {
    std::memmove(target.base, source.base, bytes);  // tensors may alias
    return absl::OkStatus();
  }
  if (copier == nullptr) {
    return WithReason(absl::FailedPreconditionError(
                          "the in-node lane has no GPU copier for GPU memory"),
                      reasons::kLocalCopy);
  }
  if (absl::Status started = copier->Start(target, source, bytes); !started.ok()) {
    return CopyFailed(started);
  }
  *device = true;
  return absl::OkStatus();
}

void InNodeFabric::ReportStats(stats::Sink& sink) const {
  using stats::Kind;
  // Copies by this node's own engines, which no NIC carries, so they are in none of
  // the per-NIC series.
  static constexpr stats::Family kBytes{
      "fuselink_in_node_bytes_total",
      "Payload bytes of in-node moves (source and target on this agent), by what copied "
      "them: memcpy between host memory, or a GPU's copy engine (GPU to GPU over "
      "NVLink, host to GPU and back over PCIe). No NIC carries them.",
      Kind::kCounter};
  static constexpr stats::Family kFailedCopies{
      "fuselink_in_node_failed_copies_total",
      "In-node writes whose copy (or the device work it waited for) failed; their "
      "transfers failed.",
      Kind::kCounter};
  static constexpr stats::Family kRefusedWrites{
      "fuselink_in_node_refused_writes_total",
      "In-node writes refused before a byte landed: no open window of this node's own "
      "under their key (late, or closed), or outside it.",
      Kind::kCounter};
  const InNodeCounters c = in_node_counters();
  sink.Add(kBytes, {{"copy", "host"}}, static_cast<double>(c.host_bytes));
  sink.Add(kBytes, {{"copy", "gpu"}}, static_cast<double>(c.device_bytes));
  sink.Add(kFailedCopies, static_cast<double>(c.failed_copies));
  sink.Add(kRefusedWrites, static_cast<double>(c.refused_writes));
}

}  // namespace fuselink::fabric
