// The scheduler workloads' entry point in fuselink-bench (sched_workloads.h).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/report.h"

namespace fuselink::bench {

// hot, serving, expert, dlrm or owner.
bool IsSchedWorkload(const std::string& name);
// Runs `workload` with the sched flags. INVALID_ARGUMENT when a needed flag is missing.
absl::StatusOr<std::vector<Result>> RunSchedFromFlags(const std::string& workload);

}  // namespace fuselink::bench
