// The verbs fabric's regions and windows (the class: verbs/fabric_impl.h).
//
// A window is enforced by the target's NIC twice over: each extent is a registration
// of its own (a write outside every extent matches no rkey's bounds), and the
// registrations live in the peer's protection domain (a write from another peer's QP
// matches no rkey of its PD). Closing deregisters them before `drained` runs, so no
// write through the window can land once `drained` has run.
#include <unistd.h>

#include <bit>
#include <cstdio>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/region_table.h"
#include "agent/fabric/verbs/fabric_impl.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric::verbs_internal {

verbs::WindowPush VerbsWindow::Push(WindowKey key, int nic) const {
  verbs::WindowPush push{.key = key, .iova_base = region->iova_base, .records = {}};
  push.records.reserve(extents.size());
  for (size_t i = 0; i < extents.size(); ++i) {
    push.records.push_back({.offset = extents[i].offset,
                            .bytes = extents[i].bytes,
                            .rkey = nics[nic].mrs[i]->rkey});
  }
  return push;
}

absl::StatusOr<RegionKey> VerbsFabric::RegisterRegion(
    void* base, uint64_t bytes, std::shared_ptr<const void> keepalive) {
  if (base == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("a region needs memory and a size");
  }
  auto region = std::make_shared<VerbsRegion>();
  region->base = static_cast<uint8_t*>(base);
  region->bytes = bytes;
  region->iova_base =
      reinterpret_cast<uintptr_t>(base) % static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  region->keepalive = std::move(keepalive);
  for (const auto& nic : nics_) {
    // Local access only: peers reach the memory through windows, never the region.
    absl::StatusOr<verbs::MemoryRegion> mr =
        verbs::RegisterMr(nic->pd(), base, bytes, IBV_ACCESS_LOCAL_WRITE);
    if (!mr.ok()) {  // the MRs made so far go with `region`
      return WithContext(mr.status(),
                         absl::StrCat("register ", bytes, " bytes on NIC ", nic->index(),
                                      " (", nic->binding().port.device, ")"));
    }
    region->mrs.push_back(*std::move(mr));
  }
  return AddRegion(std::move(region));
}

absl::StatusOr<RegionKey> VerbsFabric::AddRegion(std::shared_ptr<VerbsRegion> region) {
  absl::MutexLock lock(&regions_mu_);
  if (regions_.size() >= kMaxRegions || next_region_key_ == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("already ", regions_.size(), " regions registered"));
  }
  const RegionKey key = next_region_key_++;
  regions_.emplace(key, std::move(region));
  return key;
}

absl::StatusOr<RegionKey> VerbsFabric::RegisterDeviceRegion(
    uint64_t address, uint64_t bytes, int gpu, std::shared_ptr<const void> keepalive) {
  if (address == 0 || bytes == 0) {
    return absl::InvalidArgumentError("a region needs memory and a size");
  }
  if (gpu < 0 || gpu >= static_cast<int>(gpu_paths_.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU ", gpu, ": this verbs fabric moves the memory of ", gpu_paths_.size(),
        " GPUs", options_.device_stager == nullptr ? " (it has no GPU runtime)" : ""));
  }
  auto region = std::make_shared<VerbsRegion>();
  region->base = reinterpret_cast<uint8_t*>(address);
  region->bytes = bytes;
  region->iova_base = address % static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  region->keepalive = std::move(keepalive);
  region->gpu = gpu;
  for (const auto& nic : nics_) {
    const std::string context =
        absl::StrCat("register ", bytes, " bytes of GPU ", gpu, " on NIC ", nic->index());
    absl::StatusOr<verbs::MemoryRegion> mr = verbs::MemoryRegion();
    switch (gpu_paths_[gpu][nic->index()]) {
      case verbs::GpuPath::kNone:
        return absl::UnimplementedError(
            absl::StrCat("NIC ", nic->index(), " cannot reach GPU ", gpu, " memory"));
      case verbs::GpuPath::kStaged:
        break;  // no MR: writes go through bounce slots
      case verbs::GpuPath::kPeerMemory:
        mr = verbs::RegisterMr(nic->pd(), region->base, bytes, IBV_ACCESS_LOCAL_WRITE);
        break;
      case verbs::GpuPath::kDmabuf:
        if (!region->dmabuf.has_value()) {
          absl::StatusOr<DmabufRange> range =
              options_.device_stager->ExportDmabuf(gpu, address, bytes);
          if (!range.ok()) {
            mr = range.status();
            break;
          }
          region->dmabuf = *std::move(range);
        }
        mr = verbs::RegisterDmabufMr(nic->pd(), region->dmabuf->fd.get(),
                                     region->dmabuf->offset, bytes, address,
                                     IBV_ACCESS_LOCAL_WRITE);
        break;
    }
    if (!mr.ok()) {
      // The probe's memory registered, this region's did not (another allocation
      // kind, a driver limit): this NIC stages it instead.
      std::fprintf(stderr, "fuselink verbs: %s: %s; staging it on NIC %d instead\n",
                   context.c_str(), mr.status().ToString().c_str(), nic->index());
      mr = verbs::MemoryRegion();
    }
    region->mrs.push_back(*std::move(mr));
  }
  return AddRegion(std::move(region));
}

absl::Status VerbsFabric::DeregisterRegion(RegionKey key) {
  absl::MutexLock lock(&regions_mu_);
  if (regions_.erase(key) == 0)
    return absl::NotFoundError(absl::StrCat("no region ", key));
  return absl::OkStatus();
}

absl::StatusOr<WindowKey> VerbsFabric::OpenWindow(RegionKey region_key,
                                                  absl::string_view peer_name,
                                                  std::span<const Extent> extents) {
  FL_RETURN_IF_ERROR(wire::ValidateNodeName(peer_name));
  std::shared_ptr<const VerbsRegion> region;
  {
    absl::ReaderMutexLock lock(&regions_mu_);
    auto it = regions_.find(region_key);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("no region ", region_key));
    }
    region = it->second;
  }
  FL_RETURN_IF_ERROR(CheckWindowExtents(extents, region->bytes));
  // The registration budget, taken for every NIC at once (all hold the same windows).
  const uint64_t wanted = extents.size();
  uint64_t before = window_registrations_.load(std::memory_order_relaxed);
  do {
    if (before + wanted > options_.max_window_registrations_per_nic) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a window of ", wanted, " extents: ", before, " of ",
                       options_.max_window_registrations_per_nic,
                       " window registrations per NIC are taken"));
    }
  } while (!window_registrations_.compare_exchange_weak(before, before + wanted));
  absl::Cleanup give_back = [&] { ReleaseRegistrations(wanted); };

  auto window = std::make_shared<VerbsWindow>();
  window->peer = std::string(peer_name);
  window->extents.assign(extents.begin(), extents.end());
  window->region = region;
  FL_RETURN_IF_ERROR(MakeShadow(*window));
  absl::Cleanup give_back_shadow = [&] {
    if (window->shadow != nullptr) shadow_bytes_.fetch_sub(window->shadow->bytes());
  };
  for (const auto& nic : nics_) {
    const std::string context =
        absl::StrCat("window for '", peer_name, "' on NIC ", nic->index());
    absl::StatusOr<std::shared_ptr<verbs::PeerDomain>> domain = nic->Domain(peer_name);
    if (!domain.ok()) return WithContext(domain.status(), context);
    VerbsWindow::OnNic& on = window->nics.emplace_back();
    on.domain = *std::move(domain);
    on.mrs.reserve(extents.size());
    for (size_t i = 0; i < extents.size(); ++i) {
      absl::StatusOr<verbs::MemoryRegion> mr = RegisterExtent(*window, nic->index(), i);
      if (!mr.ok()) return WithContext(mr.status(), context);  // `window` undoes it
      on.mrs.push_back(*std::move(mr));
    }
  }
  // The software half holds the region alive for as long as the window is open.
  auto software = std::make_shared<const Region>(Region{.base = region->base,
                                                        .bytes = region->bytes,
                                                        .keepalive = region,
                                                        .gpu = region->gpu,
                                                        .shadow = window->shadow});
  FL_ASSIGN_OR_RETURN(const WindowKey key,
                      window_table_.Open(std::move(software), peer_name, extents));
  std::vector<std::pair<LinkPtr, verbs::WindowPush>> pushes;
  {
    absl::MutexLock lock(&mu_);
    open_windows_.emplace(key, window);
    for (auto& [id, entry] : links_) {
      if (!entry.pushing || entry.link->peer_name() != peer_name) continue;
      pushes.push_back({entry.link, window->Push(key, entry.link->nic().index())});
    }
  }
  std::move(give_back).Cancel();
  std::move(give_back_shadow).Cancel();
  // The peer knows the window on every NIC it is connected on before the key can be
  // handed out. A link that does not ACK in time is closed (its QPs fail over).
  for (auto& [link, push] : pushes) {
    if (absl::Status pushed = link->PushWindow(push); !pushed.ok()) {
      link->Close(pushed);
    }
  }
  return key;
}

void VerbsFabric::CloseWindow(WindowKey key, absl::AnyInvocable<void() &&> drained) {
  // From now on no arrival through the window is delivered; once those being delivered
  // are done, the closer thread deregisters the window and only then runs `drained`.
  window_table_.Close(key, [this, key, drained = std::move(drained)]() mutable {
    closer_.Run([this, key, drained = std::move(drained)]() mutable {
      FinishClose(key, std::move(drained));
    });
  });
}

void VerbsFabric::FinishClose(WindowKey key, absl::AnyInvocable<void() &&> drained) {
  std::shared_ptr<VerbsWindow> window;
  std::vector<LinkPtr> tell;
  {
    absl::MutexLock lock(&mu_);
    auto it = open_windows_.find(key);
    if (it != open_windows_.end()) {
      window = std::move(it->second);
      open_windows_.erase(it);
      for (auto& [id, entry] : links_) {
        if (options_.push_window_closes && entry.pushing &&
            entry.link->peer_name() == window->peer) {
          tell.push_back(entry.link);
        }
      }
    }
  }
  if (window != nullptr) {
    // ibv_dereg_mr returns once the NIC can no longer place bytes through the key.
    for (VerbsWindow::OnNic& on : window->nics) {
      for (verbs::MemoryRegion& mr : on.mrs) KeepTeardownError(mr.Reset());
    }
    ReleaseRegistrations(window->extents.size());
    if (window->shadow != nullptr) shadow_bytes_.fetch_sub(window->shadow->bytes());
    window.reset();
  }
  if (drained) std::move(drained)();
  for (const LinkPtr& link : tell) link->PushWindowRemove(key);
}

absl::Status VerbsFabric::MakeShadow(VerbsWindow& window) {
  const VerbsRegion& region = *window.region;
  uint64_t staged_nics = 0;
  for (const auto& nic : nics_) {
    if (region.gpu >= 0 && !region.mrs[nic->index()]) staged_nics |= 1ull << nic->index();
  }
  if (staged_nics == 0) return absl::OkStatus();
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const int nic = std::countr_zero(staged_nics);
  uint64_t charged = 0;  // against max_shadow_bytes, given back if Create fails after
  absl::StatusOr<std::shared_ptr<const HostShadow>> shadow =
      HostShadow::Create(window.extents, region.iova_base, page, staged_nics,
                         [&](uint64_t bytes) -> absl::StatusOr<std::shared_ptr<uint8_t>> {
                           const uint64_t before = shadow_bytes_.fetch_add(bytes);
                           if (before + bytes > options_.max_shadow_bytes) {
                             shadow_bytes_.fetch_sub(bytes);
                             return absl::ResourceExhaustedError(absl::StrCat(
                                 "a window into GPU ", region.gpu, " needs ", bytes,
                                 " bytes of host shadow: ", before, " of ",
                                 options_.max_shadow_bytes, " are taken"));
                           }
                           absl::StatusOr<std::shared_ptr<uint8_t>> memory =
                               options_.device_stager->AllocatePinned(nic, bytes);
                           if (memory.ok()) {
                             charged = bytes;
                           } else {
                             shadow_bytes_.fetch_sub(bytes);
                           }
                           return memory;
                         });
  if (!shadow.ok()) {
    shadow_bytes_.fetch_sub(charged);
    return shadow.status();
  }
  window.shadow = *std::move(shadow);
  return absl::OkStatus();
}

absl::StatusOr<verbs::MemoryRegion> VerbsFabric::RegisterExtent(const VerbsWindow& window,
                                                                int nic, size_t i) {
  const VerbsRegion& region = *window.region;
  const Extent& e = window.extents[i];
  constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ibv_pd* pd = window.nics[nic].domain->pd();
  const uint64_t iova = region.iova_base + e.offset;
  if (window.shadow != nullptr && window.shadow->staged_on(nic)) {
    return verbs::RegisterMrAt(pd, window.shadow->extent_base(i), e.bytes, iova, kAccess);
  }
  // The region's own registration on this NIC went by dma-buf: so do its windows'.
  if (region.gpu >= 0 && gpu_paths_[region.gpu][nic] == verbs::GpuPath::kDmabuf) {
    return verbs::RegisterDmabufMr(pd, region.dmabuf->fd.get(),
                                   region.dmabuf->offset + e.offset, e.bytes, iova,
                                   kAccess);
  }
  return verbs::RegisterMrAt(pd, region.base + e.offset, e.bytes, iova, kAccess);
}

void VerbsFabric::ReleaseRegistrations(size_t count) {
  window_registrations_.fetch_sub(count, std::memory_order_relaxed);
}

void VerbsFabric::KeepTeardownError(const absl::Status& status) {
  if (status.ok()) return;
  absl::MutexLock lock(&teardown_error_mu_);
  if (!teardown_error_.ok()) return;
  teardown_error_ = status;
  std::fprintf(stderr, "fuselink verbs: a window's deregistration failed, kept: %s\n",
               status.ToString().c_str());
}

std::vector<verbs::WindowPush> VerbsFabric::StartPushing(uint64_t link) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(link);
  if (it == links_.end()) return {};
  it->second.pushing = true;
  const std::string peer = it->second.link->peer_name();
  const int nic = it->second.link->nic().index();
  std::vector<verbs::WindowPush> windows;
  for (const auto& [key, window] : open_windows_) {
    if (window->peer == peer) windows.push_back(window->Push(key, nic));
  }
  return windows;
}

Refusal VerbsFabric::Judge(WindowKey key, absl::string_view peer, uint64_t offset,
                           uint64_t bytes) {
  std::variant<WindowTable::Placement, Refusal> admitted =
      window_table_.Admit(key, peer, offset, bytes);
  if (const Refusal* why = std::get_if<Refusal>(&admitted)) return *why;
  return Refusal::kNone;
}

}  // namespace fuselink::fabric::verbs_internal
