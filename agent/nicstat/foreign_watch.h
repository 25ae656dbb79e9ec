// The foreign-traffic watch of one node: per NIC, the kernel's byte counters (its
// netdev, or its RDMA port), fuselink's own bytes on that NIC, and from the two the
// foreign bytes each way (ForeignMeter), their rate over a short window and whether
// the NIC is busy for lending (sched::ForeignStep).
//
// Which NICs are watched is decided once, at Create; a NIC that cannot be watched is
// left out with its reason and never judged busy:
//  - its address on no interface, or on a loopback interface (the emulated node: the
//    loopback's counters carry every local process's traffic);
//  - its counters shared with another NIC (one netdev, or one RDMA port under two
//    netdevs): fuselink's per-NIC counts cannot be told apart on one counter, so each
//    NIC's bytes would count as the other's foreign traffic;
//  - no counter files, no line rate to take the default threshold from, or a
//    threshold of 0;
//  - verbs: no RDMA port belongs to its netdev (the netdev's counters may not see
//    RDMA traffic at all).
// Verbs NICs whose RDMA port exists but has no data counters (Soft-RoCE) are watched
// through their netdev, which carries rxe's frames.
// A NIC whose counters cannot be read for `hold` in a row is no longer busy: a
// counter that vanished must not keep the NIC from lending for good.
// Thread safety: Sample from one thread at a time; the accessors from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/common/stats.h"
#include "agent/nicstat/foreign_meter.h"
#include "agent/nicstat/netdev.h"
#include "agent/nicstat/sysfs_counters.h"
#include "agent/sched/foreign_rule.h"
#include "agent/sched/scheduler.h"

namespace fuselink::nicstat {

// Masks are one bit a NIC (kMaxNics, agent/common/limits.h), handed to the scheduler
// and the landing as they are.
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
  // Foreign bytes per second that make a NIC busy; -1: kDefaultBusyFraction of its
  // line rate; 0: foreign detection off.
  int64_t busy_bytes_per_s = -1;
  // The wire-overhead allowance: kernel bytes that fuselink's own payload costs on
  // top of itself, as fractions of that payload. Same direction: the headers of its
  // frames (66 bytes of Ethernet, IPv4 and TCP with timestamps per 1448-byte segment
  // at a 1500-byte MTU: 4.6%). Reverse direction: the acknowledgements the other
  // way (one 66-byte ACK per two segments: 2.3%). Kept apart so that sending at line
  // rate does not excuse a reverse-direction allowance as large as the threshold,
  // which would hide foreign traffic coming in (docs/design.md).
  // Each 0 to 1.
  double header_overhead_fraction = 0.05;
  double ack_overhead_fraction = 0.025;
  // The rate is foreign bytes over about this long.
  absl::Duration window = absl::Milliseconds(50);
  double release_fraction = 0.5;
  // Under the release level this long: busy no more. Unreadable counters this long:
  // busy no more either.
  absl::Duration hold = absl::Milliseconds(300);
  // Where sysfs is; tests point it at a tree of their own.
  std::string sysfs_root = "/sys";
  // verbs: the RDMA port's counters instead of the netdev's.
  bool rdma = false;

  // INVALID_ARGUMENT naming the first field out of its range above
  // (agent/common/options.h).
  absl::Status Validate() const;
};
inline constexpr double kDefaultBusyFraction = 0.05;

// Fuselink's own bytes on one NIC now: cumulative payload that crossed the link each
// way (NicCounters::wire_*), and bounds on its bytes the kernel may have counted but
// fuselink not yet (in flight).
struct OwnBytes {
  uint64_t tx = 0, rx = 0;
  uint64_t tx_slack = 0, rx_slack = 0;
};

// Own bytes for a kernel read taken between two snapshots, `before` and `after`.
// Own bytes the kernel may hold at its read and fuselink's count does not at
// `before`: those in flight at `before` (before's slack), and those that started
// after it, which by `after` are either still in flight (after's slack) or counted
// (after's count less before's). So: the count of `before`, and the sum as slack.
OwnBytes Bracket(const OwnBytes& before, const OwnBytes& after);

// A monotonic clock for the watch's times: time since an arbitrary epoch.
absl::Duration SteadyNow();

class ForeignWatch {
 public:
  using ListFn = std::function<absl::StatusOr<std::vector<InterfaceAddress>>()>;
  // Never fails: NICs that cannot be watched are left out, with their reason.
  static std::unique_ptr<ForeignWatch> Create(const std::vector<WatchedNic>& nics,
                                              const ForeignOptions& options,
                                              const ListFn& list = ListInterfaces);

  // Fills own[k] with NIC k's own bytes now, for every NIC.
  using OwnFn = absl::FunctionRef<void(std::span<OwnBytes>)>;
  // One look at `now` (SteadyNow's clock): `read_own` before every watched NIC's
  // counters are read and again after, their Bracket the own bytes of the look. A
  // counter that cannot be read this time leaves that NIC's state as it was, for
  // up to `hold` of failed looks; then the NIC is busy no more.
  void Sample(absl::Duration now, OwnFn read_own);

  int nic_count() const { return static_cast<int>(nics_.size()); }
  bool watched(int nic) const { return nics_[nic].source.has_value(); }
  bool any_watched() const;
  // Why NIC `nic` is not watched, or where its counters come from.
  const std::string& why(int nic) const { return nics_[nic].why; }
  // One line per NIC, for the agent's start-up log.
  std::string Describe() const;
  uint64_t foreign_bytes(int nic, Direction d) const {
    return nics_[nic].dir[d].total.load(std::memory_order_relaxed);
  }
  // Bit k: NIC k is busy for lending in direction `d`.
  uint32_t busy_mask(Direction d) const {
    return busy_mask_[d].load(std::memory_order_acquire);
  }
  // Looks at NIC `nic` whose counters could not be read.
  uint64_t read_errors(int nic) const {
    return nics_[nic].read_errors.load(std::memory_order_relaxed);
  }

  // Which NICs are watched; for those, per direction, foreign bytes and whether
  // they are busy, and the looks that failed.
  void ReportStats(stats::Sink& sink) const;

 private:
  struct Dir {
    ForeignMeter meter;
    sched::ForeignState state;
    std::array<absl::Duration, kRateSamples> at{};
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
    // The first of the failed reads in a row; InfiniteDuration: the last read worked.
    absl::Duration failing_since = absl::InfiniteDuration();
    std::atomic<uint64_t> read_errors{0};
  };
  explicit ForeignWatch(const ForeignOptions& options, int nics);
  // Foreign bytes per second over the window ending at the newest look.
  double Rate(const Dir& d) const;

  const ForeignOptions options_;
  std::vector<Nic> nics_;
  std::atomic<uint32_t> busy_mask_[2] = {0, 0};
};

}  // namespace fuselink::nicstat
