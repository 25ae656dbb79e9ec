#include "agent/fabric/verbs/fabric.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/checks.h"
#include "agent/fabric/region_table.h"
#include "agent/fabric/verbs/device.h"
#include "agent/fabric/verbs/fabric_impl.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric {
namespace verbs_internal {

// One peer's QPs on a NIC (a HELLO's) fit the QPs that NIC holds over all peers.
static_assert(verbs::wire::kMaxQpsPerHello <= verbs::kMaxQpsPerNic);

absl::Status ValidateOptions(const VerbsFabricOptions& o, const Handler* handler) {
  FL_RETURN_IF_ERROR(CheckFabricBasics(handler, o.keys, o.node_name, o.nics));
  auto in = [](uint64_t v, uint64_t lo, uint64_t hi, absl::string_view name) {
    return v >= lo && v <= hi ? absl::OkStatus()
                              : absl::InvalidArgumentError(
                                    absl::StrCat(name, " must be ", lo, "..", hi));
  };
  FL_RETURN_IF_ERROR(
      in(o.qps_per_peer_nic, 1, verbs::wire::kMaxQpsPerHello, "qps_per_peer_nic"));
  FL_RETURN_IF_ERROR(in(o.wr_depth_per_qp, 1, kMaxWrDepth, "wr_depth_per_qp"));
  FL_RETURN_IF_ERROR(in(o.recv_depth_per_qp, 1, kMaxWrDepth, "recv_depth_per_qp"));
  FL_RETURN_IF_ERROR(
      in(o.queue_depth_per_nic, 1, kMaxVerbsQueueDepthPerNic, "queue_depth_per_nic"));
  FL_RETURN_IF_ERROR(
      in(o.max_qps_per_nic, o.qps_per_peer_nic, verbs::kMaxQpsPerNic, "max_qps_per_nic"));
  FL_RETURN_IF_ERROR(
      in(o.max_write_bytes, 1, wire::kMaxWriteBytesLimit, "max_write_bytes"));
  FL_RETURN_IF_ERROR(
      in(o.staging_slots_per_nic, 1, kMaxStagingSlotsPerNic, "staging_slots_per_nic"));
  FL_RETURN_IF_ERROR(
      in(o.staging_slots_per_peer, 0, o.staging_slots_per_nic,
         "staging_slots_per_peer (0: three quarters of staging_slots_per_nic)"));
  FL_RETURN_IF_ERROR(
      in(o.staging_slot_bytes, 1, o.max_write_bytes, "staging_slot_bytes"));
  FL_RETURN_IF_ERROR(in(o.gpu_count, 0, o.device_stager != nullptr ? 1024 : 0,
                        "gpu_count (0 without a device stager)"));
  if (!o.gpu_direct.empty()) {
    bool shaped = o.gpu_direct.size() == static_cast<size_t>(o.gpu_count);
    for (const std::vector<bool>& row : o.gpu_direct)
      shaped &= row.size() == o.nics.size();
    if (!shaped) return absl::InvalidArgumentError("gpu_direct must be gpu_count x NICs");
  }
  FL_RETURN_IF_ERROR(in(o.max_window_registrations_per_nic, 1,
                        kMaxWindowRegistrationsPerNic,
                        "max_window_registrations_per_nic"));
  FL_RETURN_IF_ERROR(in(absl::ToInt64Milliseconds(o.ack_timeout), 1, kMaxTimeoutMs,
                        "ack_timeout in ms"));
  FL_RETURN_IF_ERROR(in(o.stall_timeout_ms, 1, kMaxTimeoutMs, "stall_timeout_ms"));
  FL_RETURN_IF_ERROR(in(o.max_links_per_peer, 0, kMaxVerbsLinks, "max_links_per_peer"));
  return absl::OkStatus();
}

VerbsFabric::NicSender::NicSender(const VerbsFabricOptions& options)
    : queues("fl-verbs-send", options.staging_slots_per_nic,
             options.staging_slots_per_peer > 0
                 ? options.staging_slots_per_peer
                 : DefaultSlotsPerPeer(options.staging_slots_per_nic)) {}

VerbsFabric::VerbsFabric(const VerbsFabricOptions& options, Handler& handler,
                         std::vector<SocketAddress> local,
                         std::vector<Endpoint> endpoints)
    : options_(options),
      handler_(handler),
      local_(std::move(local)),
      endpoints_(std::move(endpoints)),
      max_links_per_peer_(options.max_links_per_peer > 0
                              ? static_cast<size_t>(options.max_links_per_peer)
                              : static_cast<size_t>(DefaultLinksPerPeer(options))) {}

absl::Status VerbsFabric::OpenNic(int index, verbs::NicBinding binding) {
  verbs::NicSizing sizing{
      .max_qps = options_.max_qps_per_nic,
      .send_depth_per_qp = options_.wr_depth_per_qp,
      .recv_depth_per_qp = options_.recv_depth_per_qp,
      .queue_depth = static_cast<uint32_t>(options_.queue_depth_per_nic),
      .max_write_bytes = options_.max_write_bytes,
      .max_window_registrations = options_.max_window_registrations_per_nic,
      .ack_timeout = options_.ack_timeout};
  FL_ASSIGN_OR_RETURN(std::unique_ptr<Nic> nic,
                      Nic::Open(index, std::move(binding), sizing, options_.rc, *this));
  nics_.push_back(std::move(nic));
  if (options_.device_stager != nullptr)
    senders_.push_back(std::make_unique<NicSender>(options_));
  return absl::OkStatus();
}

absl::Status VerbsFabric::ChooseGpuPaths() {
  const bool peer_memory = verbs::PeerMemoryLoaded(options_.sysfs_root);
  for (int gpu = 0; gpu < options_.gpu_count; ++gpu) {
    std::vector<verbs::GpuPath>& paths = gpu_paths_.emplace_back();
    std::string line = absl::StrCat("fuselink verbs: GPU ", gpu, " memory:");
    for (const auto& nic : nics_) {
      const int k = nic->index();
      const bool near = options_.gpu_direct.empty() || options_.gpu_direct[gpu][k];
      // Too far for GPUDirect: no probe, the pair stages (null PD: staging only).
      paths.push_back(verbs::ChooseGpuPath(verbs::ProbeGpuPath(
          options_.device_stager, gpu, near ? nic->pd() : nullptr, peer_memory)));
      absl::StrAppend(&line, " NIC ", k, " ", verbs::GpuPathName(paths.back()),
                      near ? "" : " (too far for GPUDirect)");
    }
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  return absl::OkStatus();
}

std::string VerbsFabric::GpuPath(int gpu, int nic) const {
  if (gpu < 0 || gpu >= static_cast<int>(gpu_paths_.size()) || nic < 0 ||
      nic >= nic_count()) {
    return "none";
  }
  return std::string(verbs::GpuPathName(gpu_paths_[gpu][nic]));
}

absl::Status VerbsFabric::Start(std::vector<UniqueFd> listeners) {
  reaper_ = std::thread(&VerbsFabric::Reap, this);
  FL_ASSIGN_OR_RETURN(
      acceptor_, Acceptor::Start(std::move(listeners), [this](int nic, UniqueFd socket) {
        OnAccepted(nic, std::move(socket));
      }));
  return absl::OkStatus();
}

VerbsFabric::~VerbsFabric() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  acceptor_.reset();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, entry] : links_) {
      entry.link->Close(absl::CancelledError("fabric shutting down"));
    }
  }
  // Deferred writes find their QPs closing, or no slot, and complete UNAVAILABLE;
  // none is left.
  for (auto& sender : senders_) sender->queues.Stop();
  // Two-phase: every QP is in ERR now; the pollers complete the flushed writes, destroy
  // the QPs and report lost peers. Then the links go, the worker finishes what it was
  // given (window closes run their `drained`), then the windows, the regions, the NICs.
  for (auto& nic : nics_) {
    nic->CloseAll(absl::CancelledError("fabric shutting down"));
    nic->WaitUntilNoQps();
    nic->StopLander();  // delivers the staged arrivals still being copied
  }
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &VerbsFabric::NoLinks));
    reaper_stop_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
  closer_.Stop();
  worker_.Stop();
  std::unordered_map<WindowKey, std::shared_ptr<VerbsWindow>> windows;
  {
    absl::MutexLock lock(&mu_);
    windows.swap(open_windows_);
  }
  for (const auto& [key, window] : windows) window_table_.Close(key, nullptr);
  windows.clear();  // registrations, then peer domains
  {
    absl::MutexLock lock(&regions_mu_);
    regions_.clear();
  }
  senders_.clear();  // bounce slots' MRs, before the NICs' PDs
  nics_.clear();
}

NicCounters VerbsFabric::counters(int nic) const {
  if (nic < 0 || nic >= nic_count()) return {};
  return NicCounters{
      .transmitted_bytes = nics_[nic]->transmitted_bytes(),
      .received_bytes = nics_[nic]->received_bytes(),
      .wire_tx_bytes = nics_[nic]->wire_tx_bytes(),
      .wire_rx_bytes = nics_[nic]->wire_rx_bytes(),
      .malformed_frames = nics_[nic]->malformed(),
      .refused_writes = nics_[nic]->refused(),
      .auth_failures = nics_[nic]->auth_failures(),
      .stalled_connections = nics_[nic]->stalled_links(),
      .ack_timeouts = nics_[nic]->ack_timeouts(),
      .peer_connection_refusals = nics_[nic]->peer_link_refusals(),
      .staged_share_waits = senders_.empty() ? 0 : senders_[nic]->queues.share_waits()};
}

}  // namespace verbs_internal

int DefaultLinksPerPeer(const VerbsFabricOptions& options) {
  return 2 * static_cast<int>(options.nics.size());
}

absl::StatusOr<std::unique_ptr<Fabric>> CreateVerbsFabric(
    const VerbsFabricOptions& options, Handler* handler) {
  FL_RETURN_IF_ERROR(verbs_internal::ValidateOptions(options, handler));
  std::vector<UniqueFd> listeners;
  std::vector<SocketAddress> local;
  std::vector<Endpoint> endpoints;
  std::vector<verbs::NicBinding> bindings;
  for (const Endpoint& nic : options.nics) {
    const std::string context = absl::StrCat("NIC ", nic.nic, " (", nic.address, ")");
    absl::StatusOr<verbs::NicBinding> binding = verbs::BindAddress(nic.address);
    if (!binding.ok()) return WithContext(binding.status(), context);
    bindings.push_back(*std::move(binding));
    absl::StatusOr<SocketAddress> address = ParseSocketAddress(nic.address, nic.port);
    if (!address.ok()) return WithContext(address.status(), context);
    absl::StatusOr<UniqueFd> listener = Listen(*address);
    if (!listener.ok()) return WithContext(listener.status(), context);
    FL_ASSIGN_OR_RETURN(SocketAddress bound, LocalAddress(listener->get()));
    endpoints.push_back(
        Endpoint{.nic = nic.nic, .address = nic.address, .port = bound.port()});
    FL_ASSIGN_OR_RETURN(SocketAddress outbound, ParseSocketAddress(nic.address, 0));
    local.push_back(outbound);
    listeners.push_back(*std::move(listener));
  }
  auto fabric = std::make_unique<verbs_internal::VerbsFabric>(
      options, *handler, std::move(local), std::move(endpoints));
  for (size_t i = 0; i < bindings.size(); ++i) {
    FL_RETURN_IF_ERROR(fabric->OpenNic(static_cast<int>(i), std::move(bindings[i])));
  }
  FL_RETURN_IF_ERROR(fabric->ChooseGpuPaths());
  FL_RETURN_IF_ERROR(fabric->Start(std::move(listeners)));
  return fabric;
}

}  // namespace fuselink::fabric
