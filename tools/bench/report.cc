#include "tools/bench/report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/common/json.h"

namespace fuselink::bench {

double Percentile(std::vector<double>& samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  // Nearest rank: the smallest sample with at least q of the samples at or below it.
  const double rank = std::ceil(q * static_cast<double>(samples.size()));
  const size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return samples[std::min(index, samples.size() - 1)];
}

Summary Summarize(std::vector<double> samples) {
  Summary s;
  s.count = samples.size();
  if (samples.empty()) return s;
  s.median = Percentile(samples, 0.5);
  s.p99 = Percentile(samples, 0.99);
  s.min = samples.front();
  s.max = samples.back();
  return s;
}

namespace {

std::string Text(const Result::Value& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) return absl::StrCat(*i);
  if (const auto* d = std::get_if<double>(&value)) return absl::StrFormat("%.3f", *d);
  return std::get<std::string>(value);
}

std::string JsonValue(const Result::Value& value) {
  if (const auto* s = std::get_if<std::string>(&value)) return JsonQuoted(*s);
  if (const auto* d = std::get_if<double>(&value)) {
    return std::isfinite(*d) ? absl::StrFormat("%.6g", *d) : "null";
  }
  return Text(value);
}

}  // namespace

std::string ToJson(const Result& result) {
  std::string out = absl::StrCat("{\"kind\":", JsonQuoted(result.kind()));
  for (const auto& [name, value] : result.fields()) {
    absl::StrAppend(&out, ",", JsonQuoted(name), ":", JsonValue(value));
  }
  return out + "}";
}

std::string ToTable(const std::vector<Result>& results) {
  std::string out;
  for (size_t begin = 0; begin < results.size();) {
    // A run of results of one kind shares a header and column widths.
    size_t end = begin;
    while (end < results.size() && results[end].kind() == results[begin].kind()) ++end;
    const auto& header = results[begin].fields();
    std::vector<size_t> widths;
    for (const auto& [name, value] : header) widths.push_back(name.size());
    for (size_t r = begin; r < end; ++r) {
      const auto& fields = results[r].fields();
      for (size_t c = 0; c < fields.size() && c < widths.size(); ++c) {
        widths[c] = std::max(widths[c], Text(fields[c].second).size());
      }
    }
    absl::StrAppend(&out, results[begin].kind(), "\n");
    for (size_t c = 0; c < header.size(); ++c) {
      absl::StrAppendFormat(&out, "  %*s", widths[c], header[c].first);
    }
    absl::StrAppend(&out, "\n");
    for (size_t r = begin; r < end; ++r) {
      const auto& fields = results[r].fields();
      for (size_t c = 0; c < fields.size() && c < widths.size(); ++c) {
        absl::StrAppendFormat(&out, "  %*s", widths[c], Text(fields[c].second));
      }
      absl::StrAppend(&out, "\n");
    }
    begin = end;
  }
  return out;
}

}  // namespace fuselink::bench
