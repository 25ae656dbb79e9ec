#include "agent/nicstat/foreign_watch.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/common/options.h"
#include "agent/common/status_macros.h"

namespace fuselink::nicstat {

OwnBytes Bracket(const OwnBytes& before, const OwnBytes& after) {
  const auto grown = [](uint64_t from, uint64_t to) { return to > from ? to - from : 0; };
  return OwnBytes{
      .tx = before.tx,
      .rx = before.rx,
      .tx_slack = before.tx_slack + after.tx_slack + grown(before.tx, after.tx),
      .rx_slack = before.rx_slack + after.rx_slack + grown(before.rx, after.rx)};
}

absl::Duration SteadyNow() {
  return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

absl::Status ForeignOptions::Validate() const {
  FL_RETURN_IF_ERROR(AtLeast<int64_t>("busy_bytes_per_s", busy_bytes_per_s, -1));
  FL_RETURN_IF_ERROR(
      InRange("header_overhead_fraction", header_overhead_fraction, 0.0, 1.0));
  return InRange("ack_overhead_fraction", ack_overhead_fraction, 0.0, 1.0);
}

ForeignWatch::ForeignWatch(const ForeignOptions& options, int nics)
    : options_(options), nics_(static_cast<size_t>(nics)) {}

std::unique_ptr<ForeignWatch> ForeignWatch::Create(const std::vector<WatchedNic>& nics,
                                                   const ForeignOptions& options,
                                                   const ListFn& list) {
  const int count = std::min<int>(static_cast<int>(nics.size()), kMaxNics);
  std::unique_ptr<ForeignWatch> w(new ForeignWatch(options, count));
  absl::StatusOr<std::vector<InterfaceAddress>> interfaces =
      options.busy_bytes_per_s == 0 ? std::vector<InterfaceAddress>{} : list();
  // Each NIC's counters; then which NICs share them.
  std::vector<std::optional<CounterSource>> sources(count);
  for (int k = 0; k < count; ++k) {
    Nic& n = w->nics_[k];
    n.name = nics[k].name;
    if (options.busy_bytes_per_s == 0) {
      n.why = "off (--foreign_busy_bytes_per_s=0)";
      continue;
    }
    if (!interfaces.ok()) {
      n.why = absl::StrCat("off: ", interfaces.status().message());
      continue;
    }
    absl::StatusOr<InterfaceAddress> netdev = NetdevOf(nics[k].address, *interfaces);
    if (!netdev.ok()) {
      n.why = absl::StrCat("off: ", netdev.status().message());
      continue;
    }
    if (netdev->loopback) {
      n.why = absl::StrCat("off: ", nics[k].address, " is on the loopback interface ",
                           netdev->name,
                           ", whose counters carry every local process's traffic and "
                           "every emulated NIC's");
      continue;
    }
    double busy = static_cast<double>(options.busy_bytes_per_s);
    if (busy < 0) {
      busy = kDefaultBusyFraction * static_cast<double>(nics[k].rate_bytes_per_s);
      if (busy <= 0) {
        n.why = "off: no line rate in the topology to take the default threshold from";
        continue;
      }
    }
    absl::StatusOr<CounterSource> source =
        options.rdma ? CounterSource::RdmaPortOf(options.sysfs_root, netdev->name)
                     : CounterSource::Netdev(options.sysfs_root, netdev->name);
    std::string fallback;
    if (options.rdma && !source.ok() &&
        ReasonOf(source.status()) == reasons::kNoCounters) {
      // The port is there without data counters (Soft-RoCE has packet counts only):
      // rxe's frames go through the netdev, whose counters see them. Not where no
      // port names the netdev: there the netdev may see none of the RDMA traffic
      // (ConnectX's goes past it), ours and foreign alike.
      absl::StatusOr<CounterSource> netdev_source =
          CounterSource::Netdev(options.sysfs_root, netdev->name);
      if (netdev_source.ok()) {
        fallback = absl::StrCat(" (", source.status().message(), ")");
        source = std::move(netdev_source);
      }
    }
    if (!source.ok()) {
      n.why = absl::StrCat("off: ", source.status().message());
      continue;
    }
    n.rule = sched::ForeignRule{.busy_bytes_per_s = busy,
                                .release_fraction = options.release_fraction,
                                .hold = options.hold};
    n.why = absl::StrCat(source->description(), fallback, ", busy at ",
                         static_cast<uint64_t>(std::llround(busy)), " B/s");
    sources[k] = *std::move(source);
  }
  // Two NICs on one counter (one netdev; two netdevs of one RDMA port): neither is
  // watched.
  std::map<std::string, std::vector<std::string>> nics_of;
  for (int k = 0; k < count; ++k) {
    if (sources[k].has_value()) nics_of[sources[k]->id()].push_back(w->nics_[k].name);
  }
  for (int k = 0; k < count; ++k) {
    if (!sources[k].has_value()) continue;
    Nic& n = w->nics_[k];
    const std::vector<std::string>& sharing = nics_of[sources[k]->id()];
    if (sharing.size() > 1) {
      n.why = absl::StrCat("off: NICs ", absl::StrJoin(sharing, ", "), " share ",
                           sources[k]->description(),
                           ": one counter cannot tell their bytes from foreign ones");
      n.rule = sched::ForeignRule{};
      continue;
    }
    n.source = *std::move(sources[k]);
  }
  return w;
}

bool ForeignWatch::any_watched() const {
  for (const Nic& n : nics_) {
    if (n.source.has_value()) return true;
  }
  return false;
}

std::string ForeignWatch::Describe() const {
  std::string out;
  for (const Nic& n : nics_)
    absl::StrAppend(&out, "foreign traffic on ", n.name, ": ", n.why, "\n");
  return out;
}

double ForeignWatch::Rate(const Dir& d) const {
  if (d.samples < 2) return 0;
  const int newest = (d.next + kRateSamples - 1) % kRateSamples;
  // The newest look at least a window before the newest, else the oldest kept.
  int from = (d.next + kRateSamples - d.samples) % kRateSamples;
  for (int i = 1; i < d.samples; ++i) {
    const int j = (newest + kRateSamples - i) % kRateSamples;
    if (d.at[newest] - d.at[j] >= options_.window) {
      from = j;
      break;
    }
  }
  const double seconds = absl::ToDoubleSeconds(d.at[newest] - d.at[from]);
  if (seconds <= 0) return 0;
  return static_cast<double>(d.cumulative[newest] - d.cumulative[from]) / seconds;
}

void ForeignWatch::Sample(absl::Duration now, OwnFn read_own) {
  const int count = nic_count();
  std::array<OwnBytes, kMaxNics> before{}, after{};
  std::array<absl::StatusOr<KernelBytes>, kMaxNics> kernel;
  read_own(std::span(before.data(), static_cast<size_t>(count)));
  for (int k = 0; k < count; ++k) {
    if (nics_[k].source.has_value()) kernel[k] = nics_[k].source->Read();
  }
  read_own(std::span(after.data(), static_cast<size_t>(count)));

  uint32_t mask[2] = {busy_mask_[kTx].load(std::memory_order_relaxed),
                      busy_mask_[kRx].load(std::memory_order_relaxed)};
  const double header = options_.header_overhead_fraction;
  const double ack = options_.ack_overhead_fraction;
  // What the kernel counts that way of `same` payload going that way and `reverse`
  // payload going the other: the payload, its frames' headers, and the other way's
  // acknowledgements.
  const auto on_wire = [header, ack](uint64_t same, uint64_t reverse) {
    return same + static_cast<uint64_t>(header * static_cast<double>(same) +
                                        ack * static_cast<double>(reverse));
  };
  for (int k = 0; k < count; ++k) {
    Nic& n = nics_[k];
    if (!n.source.has_value()) continue;
    if (!kernel[k].ok()) {
      n.read_errors.fetch_add(1, std::memory_order_relaxed);
      if (n.failing_since == absl::InfiniteDuration()) n.failing_since = now;
      if (now - n.failing_since >= options_.hold) {
        // Nothing to judge by for that long: lend again rather than for good. The
        // rate starts afresh once the counters come back.
        for (Dir& x : n.dir) {
          x.state = sched::ForeignState{};
          x.samples = 0;
        }
        mask[kTx] &= ~(1u << k);
        mask[kRx] &= ~(1u << k);
      }
      continue;
    }
    n.failing_since = absl::InfiniteDuration();
    const OwnBytes o = Bracket(before[k], after[k]);
    const uint64_t dir_own[2] = {on_wire(o.tx, o.rx), on_wire(o.rx, o.tx)};
    const uint64_t dir_kernel[2] = {kernel[k]->tx, kernel[k]->rx};
    const uint64_t dir_slack[2] = {on_wire(o.tx_slack, o.rx_slack),
                                   on_wire(o.rx_slack, o.tx_slack)};
    for (int d : {kTx, kRx}) {
      Dir& x = n.dir[d];
      x.meter.Update(dir_kernel[d], dir_own[d], dir_slack[d]);
      x.total.store(x.meter.total(), std::memory_order_relaxed);
      x.at[x.next] = now;
      x.cumulative[x.next] = x.meter.total();
      x.next = (x.next + 1) % kRateSamples;
      x.samples = std::min(x.samples + 1, kRateSamples);
      const bool busy = sched::ForeignStep(n.rule, Rate(x), now, x.state);
      mask[d] = busy ? mask[d] | 1u << k : mask[d] & ~(1u << k);
    }
  }
  busy_mask_[kTx].store(mask[kTx], std::memory_order_release);
  busy_mask_[kRx].store(mask[kRx], std::memory_order_release);
}

void ForeignWatch::ReportStats(stats::Sink& sink) const {
  using stats::Kind;
  static constexpr stats::Family kWatched{
      "fuselink_nic_foreign_watched",
      "1 while the kernel's counters of the NIC are read for traffic that is not "
      "fuselink's; 0 where they cannot be told apart (the agent logs why at start-up).",
      Kind::kGauge};
  static constexpr stats::Family kReadErrors{
      "fuselink_nic_foreign_read_errors_total",
      "Looks at the NIC whose kernel counters could not be read; after "
      "--foreign_hold_ms of them in a row the NIC is no longer foreign-busy.",
      Kind::kCounter};
  static constexpr stats::Family kBytes{
      "fuselink_nic_foreign_bytes_total",
      "Bytes the kernel counted on the NIC that fuselink did not move (NCCL, storage, "
      "anyone's), its own frames' overhead allowed for.",
      Kind::kCounter};
  static constexpr stats::Family kBusy{
      "fuselink_nic_foreign_busy",
      "1 while foreign traffic on the NIC is above --foreign_busy_bytes_per_s that way. "
      "Under --policy=fuselink: tx, the NIC lends nothing to this node's GPUs; rx, "
      "sources are told it is not idle here. The static and stripe policies ignore it.",
      Kind::kGauge};
  const int nics = std::min(sink.nic_count(), nic_count());
  for (int k = 0; k < nics; ++k) sink.AddPerNic(kWatched, k, watched(k) ? 1 : 0);
  // NICs not watched (loopback, a shared netdev, no counters) export no series below:
  // a zero would claim an idle link that nobody looked at.
  for (int k = 0; k < nics; ++k) {
    if (!watched(k)) continue;
    sink.AddPerNic(kReadErrors, k, static_cast<double>(read_errors(k)));
    for (Direction d : {kTx, kRx}) {
      const stats::Labels way = {{"direction", d == kTx ? "tx" : "rx"}};
      sink.AddPerNic(kBytes, k, static_cast<double>(foreign_bytes(k, d)), way);
      sink.AddPerNic(kBusy, k, busy_mask(d) >> k & 1, way);
    }
  }
}

}  // namespace fuselink::nicstat
