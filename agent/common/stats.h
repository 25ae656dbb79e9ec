// What a part of the agent counts, declared by the part itself and read when asked (a
// scrape of /metrics): each part that counts something is a stats::Source, and reports
// its series into a Sink; the metrics endpoint (services/metrics) walks the node's
// sources and renders what they reported, knowing none of them. A family's name and
// help are written once, beside the counter they describe.
//
// A Sink is filled by one thread (the scrape's); sources read their own counters
// however they keep them (atomics, a lock of their own).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace fuselink::stats {

enum class Kind : uint8_t { kCounter, kGauge };

// A family of series: its name (fuselink_..., units last), one line of help, its kind.
struct Family {
  const char* name;
  const char* help;
  Kind kind;
};

using Labels = std::vector<std::pair<std::string, std::string>>;

struct Sample {
  Labels labels;
  double value = 0;
};

struct Series {
  Family family;
  std::vector<Sample> samples;
};

// A NIC as per-NIC series label it.
struct NicLabel {
  std::string name;
  int owner_gpu = -1;
};

class Sink {
 public:
  explicit Sink(std::vector<NicLabel> nics) : nics_(std::move(nics)) {}

  int nic_count() const { return static_cast<int>(nics_.size()); }
  const std::string& nic_name(int nic) const { return nics_.at(nic).name; }
  // One sample of `family`. Several sources may add to one family (one label value
  // each); the family is listed where its first sample came.
  void Add(const Family& family, Labels labels, double value);
  void Add(const Family& family, double value) { Add(family, {}, value); }
  // NIC `nic`'s sample: labelled nic and owner_gpu, then `extra`.
  void AddPerNic(const Family& family, int nic, double value, Labels extra = {});
  // Lists `family` even if nothing adds a sample to it.
  void Declare(const Family& family);

  const std::vector<Series>& series() const { return series_; }

 private:
  Series& Find(const Family& family);

  std::vector<NicLabel> nics_;
  std::vector<Series> series_;
  absl::flat_hash_map<std::string, size_t> index_;  // family name -> series_
};

// A part that counts something.
class Source {
 public:
  virtual ~Source() = default;
  // Adds what it counts to `sink`. Called on the scrape's thread; never blocks for
  // long (reads counters).
  virtual void ReportStats(Sink& sink) const = 0;
};

// Families that several parts report into, each with its own label value.
inline constexpr Family kShareRefusals{
    "fuselink_share_refusals_total",
    "Calls refused RESOURCE_EXHAUSTED because their caller held its share, by reason: "
    "TENSOR_SHARE, LAYOUT_PART_SHARE (RegisterTensor, per engine), WATCH_SHARE "
    "(WatchTransfers, per identity), TRANSFER_SHARE (TransferKVCache, per router).",
    Kind::kCounter};

}  // namespace fuselink::stats
