// The scheduler workloads' entry point in fuselink-bench (sched_workloads.h).
#pragma once

#include <string>

namespace fuselink::bench {

// hot, serving, expert, dlrm or owner.
bool IsSchedWorkload(const std::string& name);
// Runs `workload` with the sched flags; prints a table (or JSON lines); the exit code.
int SchedMain(const std::string& workload, bool json);

}  // namespace fuselink::bench
