// Reading an agent's /metrics: a plain HTTP GET and one sample out of the Prometheus
// text. For tests and benchmarks, which scrape without a Prometheus server.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fuselink::client {

// GET `url` (http://host:port/path); the body. UNAVAILABLE when it cannot be read or
// the answer is not 200.
absl::StatusOr<std::string> HttpGet(const std::string& url, absl::Duration timeout);

// The value of the first sample of metric `name` whose labels contain every
// `label="value"` pair given; NOT_FOUND if none.
absl::StatusOr<double> MetricValue(const std::string& body, const std::string& name,
                                   const std::map<std::string, std::string>& labels = {});

}  // namespace fuselink::client
