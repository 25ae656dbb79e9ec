#include "agent/nicstat/foreign_watch.h"

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fuselink::nicstat {

ForeignWatch::ForeignWatch(const ForeignOptions& options, int nics)
    : options_(options), nics_(static_cast<size_t>(nics)) {}

std::unique_ptr<ForeignWatch> ForeignWatch::Create(const std::vector<WatchedNic>& nics,
                                                   const ForeignOptions& options,
                                                   const ListFn& list) {
  const int count = std::min<int>(static_cast<int>(nics.size()), kMaxNics);
  std::unique_ptr<ForeignWatch> w(new ForeignWatch(options, count));
  absl::StatusOr<std::vector<InterfaceAddress>> interfaces =
      options.busy_bytes_per_s == 0 ? std::vector<InterfaceAddress>{} : list();
  // The netdev of each NIC, and which NICs share one.
  std::vector<std::optional<InterfaceAddress>> netdev(count);
  std::map<std::string, std::vector<std::string>> nics_of;
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
    absl::StatusOr<InterfaceAddress> found = NetdevOf(nics[k].address, *interfaces);
    if (!found.ok()) {
      n.why = absl::StrCat("off: ", found.status().message());
      continue;
    }
    if (found->loopback) {
      n.why = absl::StrCat("off: ", nics[k].address, " is on the loopback interface ",
                           found->name,
                           ", whose counters carry every local process's traffic and "
                           "every emulated NIC's");
      continue;
    }
    netdev[k] = *found;
    nics_of[found->name].push_back(n.name);
  }
  for (int k = 0; k < count; ++k) {
    Nic& n = w->nics_[k];
    if (!netdev[k].has_value()) continue;
    const std::vector<std::string>& sharing = nics_of[netdev[k]->name];
    if (sharing.size() > 1) {
      n.why = absl::StrCat("off: NICs ", absl::StrJoin(sharing, ", "), " share netdev ",
                           netdev[k]->name,
                           ": one counter cannot tell their bytes from foreign ones");
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
        options.rdma ? CounterSource::RdmaPortOf(options.sysfs_root, netdev[k]->name)
                     : CounterSource::Netdev(options.sysfs_root, netdev[k]->name);
    std::string fallback;
    if (options.rdma && !source.ok()) {
      // A port without data counters (Soft-RoCE has packet counts only): the netdev's
      // counters instead. Safe either way: where RDMA bypasses the netdev (ConnectX),
      // they hold none of our bytes, and subtracting ours only under-counts.
      absl::StatusOr<CounterSource> netdev_source =
          CounterSource::Netdev(options.sysfs_root, netdev[k]->name);
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
    n.source = *std::move(source);
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

void ForeignWatch::Sample(absl::Time now, std::span<const OwnBytes> own) {
  uint32_t mask[2] = {busy_mask_[kTx].load(std::memory_order_relaxed),
                      busy_mask_[kRx].load(std::memory_order_relaxed)};
  for (int k = 0; k < nic_count() && k < static_cast<int>(own.size()); ++k) {
    Nic& n = nics_[k];
    if (!n.source.has_value()) continue;
    absl::StatusOr<KernelBytes> kernel = n.source->Read();
    if (!kernel.ok()) {
      read_errors_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    const OwnBytes& o = own[k];
    const double a = options_.overhead_fraction;
    // Each direction's kernel count carries our payload that way plus the overhead
    // of all our traffic: frame headers of what we send, acknowledgements of what we
    // receive (and the reverse on the other side).
    const auto with_overhead = [a](uint64_t payload, uint64_t other) {
      return payload + static_cast<uint64_t>(a * static_cast<double>(payload + other));
    };
    const uint64_t dir_own[2] = {with_overhead(o.tx, o.rx), with_overhead(o.rx, o.tx)};
    const uint64_t dir_kernel[2] = {kernel->tx, kernel->rx};
    const uint64_t dir_slack[2] = {with_overhead(o.tx_slack, o.rx_slack),
                                   with_overhead(o.rx_slack, o.tx_slack)};
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

}  // namespace fuselink::nicstat
