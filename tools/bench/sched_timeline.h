// Every NIC's rate over time, own and borrowed traffic apart: a thread reads the
// sending agents' fuselink_nic_transmitted_bytes_total every `period` while a
// workload runs; the samples become a gnuplot data file per policy and, once every
// policy ran, one PNG (a panel per policy and NIC).
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tools/bench/sched_cluster.h"

namespace fuselink::bench {

// One read of one agent: cumulative bytes per NIC.
struct NicSample {
  absl::Time at;
  int node = 0;
  std::vector<double> own_bytes, borrowed_bytes;
};

// Reads the metrics of `nodes` of `cluster` every `period` from Start to Stop. Not
// copyable; Stop before destruction (the destructor stops too).
class Sampler {
 public:
  Sampler(const Cluster& cluster, std::vector<int> nodes, absl::Duration period);
  ~Sampler();
  void Start();
  void Stop();
  // One read now of every sampled node, also kept in the timeline.
  void SampleNow();
  // The samples so far (a copy).
  std::vector<NicSample> samples() const;
  absl::Time started() const { return started_; }

  // Writes `path`: a header comment, then per sample instant "t_s" and, per NIC,
  // own and borrowed Gbit/s summed over the sampled nodes (rates between
  // consecutive reads). Returns false if it cannot be written.
  bool WriteRates(const std::string& path) const;

 private:
  void Loop();
  const Cluster& cluster_;
  const std::vector<int> nodes_;
  const absl::Duration period_;
  absl::Time started_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable absl::Mutex mu_;
  std::vector<NicSample> samples_ ABSL_GUARDED_BY(mu_);
};

// Runs gnuplot on DIR/<workload>-<policy>.dat for each policy into `png`: rows are
// policies, columns NICs, each panel own (solid) and borrowed (stacked) Gbit/s.
// The y axis ends at `ymax_gbps`. Writes the gnuplot script next to the data. Returns
// gnuplot's exit status.
int PlotRates(const std::string& dir, const std::string& workload,
              const std::vector<std::string>& policies, int nics,
              const std::string& title, double ymax_gbps, const std::string& png);

}  // namespace fuselink::bench
