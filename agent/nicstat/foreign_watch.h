// The foreign-traffic watch of one node: per NIC, the kernel's byte counters (its
// netdev, or its RDMA port), fuselink's own bytes on that NIC, and from the two the
// foreign bytes each way (ForeignMeter), their rate over a short window and whether
// the NIC is busy for lending (sched::ForeignStep).
//
// Which NICs are watched is decided once, at Create; a NIC that cannot be watched is
// left out with its reason and never judged busy:
//  - its address on no interface, or on a loopback interface (the emulated node: the
//    loopback's counters carry every local process's traffic);
//  - its netdev shared with another NIC (whose bytes would count as each other's
//    foreign traffic: fuselink's per-NIC counts cannot be told apart on one counter);
//  - no counter files, no line rate to take the default threshold from, or a
//    threshold of 0.
// Verbs NICs whose RDMA port has no data counters are watched through their netdev.
// Thread safety: Sample from one thread at a time; the accessors from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/nicstat/foreign_meter.h"
#include "agent/nicstat/netdev.h"
#include "agent/nicstat/sysfs_counters.h"
#include "agent/sched/foreign_rule.h"

namespace fuselink::nicstat {

inline constexpr int kMaxNics = 16;  // as sched::kMaxNics: masks are one bit a NIC
// Looks kept per NIC and direction for the rate window: enough for the default 50 ms
// window at checks every 2 ms or slower; at faster checks the rate is taken over the
// looks kept (a shorter window).
inline constexpr int kRateSamples = 32;

enum Direction { kTx = 0, kRx = 1 };

struct WatchedNic {
  std::string name;
  std::string address;  // IPv4
  uint64_t rate_bytes_per_s = 0;
};

struct ForeignOptions {
  // Foreign bytes per second that make a NIC busy; negative: kDefaultBusyFraction of
  // its line rate; 0: foreign detection off.
  int64_t busy_bytes_per_s = -1;
  // The wire-overhead allowance: kernel bytes that fuselink's own payload costs on
  // top of itself, as a fraction of its payload both ways (headers of its frames,
  // acknowledgements of what it receives). docs/design.md says how it was measured.
  double overhead_fraction = 0.05;
  // The rate is foreign bytes over about this long.
  absl::Duration window = absl::Milliseconds(50);
  double release_fraction = 0.5;
  absl::Duration hold = absl::Milliseconds(300);
  // Where sysfs is; tests point it at a tree of their own.
  std::string sysfs_root = "/sys";
  // verbs: the RDMA port's counters instead of the netdev's.
  bool rdma = false;
};
inline constexpr double kDefaultBusyFraction = 0.05;

// Fuselink's own bytes on one NIC now: cumulative payload each way, and bounds on its
// bytes the kernel may have counted but fuselink not yet (in flight).
struct OwnBytes {
  uint64_t tx = 0, rx = 0;
  uint64_t tx_slack = 0, rx_slack = 0;
};

class ForeignWatch {
 public:
  using ListFn = std::function<absl::StatusOr<std::vector<InterfaceAddress>>()>;
  // Never fails: NICs that cannot be watched are left out, with their reason.
  static std::unique_ptr<ForeignWatch> Create(const std::vector<WatchedNic>& nics,
                                              const ForeignOptions& options,
                                              const ListFn& list = ListInterfaces);

  // One look at `now`: reads every watched NIC's counters, `own[k]` is NIC k's own
  // bytes. A counter that cannot be read this time leaves that NIC's state as it was.
  void Sample(absl::Time now, std::span<const OwnBytes> own);

  int nic_count() const { return static_cast<int>(nics_.size()); }
  bool watched(int nic) const { return nics_[nic].source.has_value(); }
  bool any_watched() const;
  // Why NIC `nic` is not watched, or where its counters come from.
  const std::string& why(int nic) const { return nics_[nic].why; }
  // One line per NIC, for the agent's start-up log.
  std::string Describe() const;
  double busy_bytes_per_s(int nic) const { return nics_[nic].rule.busy_bytes_per_s; }
  uint64_t foreign_bytes(int nic, Direction d) const {
    return nics_[nic].dir[d].total.load(std::memory_order_relaxed);
  }
  // Bit k: NIC k is busy for lending in direction `d`.
  uint32_t busy_mask(Direction d) const {
    return busy_mask_[d].load(std::memory_order_acquire);
  }
  uint64_t read_errors() const { return read_errors_.load(std::memory_order_relaxed); }

 private:
  struct Dir {
    ForeignMeter meter;
    sched::ForeignState state;
    std::array<absl::Time, kRateSamples> at{};
    std::array<uint64_t, kRateSamples> cumulative{};
    int samples = 0, next = 0;
    std::atomic<uint64_t> total{0};
  };
  struct Nic {
    std::string name;
    std::optional<CounterSource> source;
    std::string why;
    sched::ForeignRule rule;
    Dir dir[2];
  };
  explicit ForeignWatch(const ForeignOptions& options, int nics);
  // Foreign bytes per second over the window ending at the newest look.
  double Rate(const Dir& d) const;

  const ForeignOptions options_;
  std::vector<Nic> nics_;
  std::atomic<uint32_t> busy_mask_[2] = {0, 0};
  std::atomic<uint64_t> read_errors_{0};
};

}  // namespace fuselink::nicstat
