// Results of fuselink-bench: order statistics over samples, and the two ways a
// result is printed (an aligned table for people, one JSON object a line for
// scripts).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace fuselink::bench {

// Order statistics of a sample. Empty samples give zeros.
struct Summary {
  double min = 0;
  double median = 0;
  double p99 = 0;
  double max = 0;
  size_t count = 0;
};
// Nearest-rank percentile `q` in [0, 1] of `samples` (sorted in place).
double Percentile(std::vector<double>& samples, double q);
Summary Summarize(std::vector<double> samples);

// One measured result: a kind ("transfer", "rpc_latency", ...) and named values,
// printed in the order they were added. Names carry their unit last (`gbps`,
// `latency_us`).
class Result {
 public:
  using Value = std::variant<int64_t, double, std::string>;
  explicit Result(std::string kind) : kind_(std::move(kind)) {}

  Result& Add(std::string name, Value value) {
    fields_.emplace_back(std::move(name), std::move(value));
    return *this;
  }
  const std::string& kind() const { return kind_; }
  const std::vector<std::pair<std::string, Value>>& fields() const { return fields_; }

 private:
  std::string kind_;
  std::vector<std::pair<std::string, Value>> fields_;
};

// {"kind":..., name: value, ...} on one line.
std::string ToJson(const Result& result);
// Results as tables: a header line whenever the kind changes, one row per result.
std::string ToTable(const std::vector<Result>& results);

}  // namespace fuselink::bench
