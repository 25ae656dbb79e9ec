#include "agent/gpu/runtime.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::gpu {

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Open(int topology_gpus) {
  FL_ASSIGN_OR_RETURN(const Driver* driver, Driver::Load());
  FL_ASSIGN_OR_RETURN(int devices, DeviceCount(*driver));
  std::unique_ptr<Runtime> runtime(new Runtime());
  runtime->driver_ = driver;
  const int n = std::min(devices, topology_gpus);
  for (int i = 0; i < n; ++i) {
    FL_ASSIGN_OR_RETURN(DeviceInfo info, QueryDevice(*driver, i));
    FL_ASSIGN_OR_RETURN(PrimaryContext context, PrimaryContext::Retain(*driver, i));
    runtime->infos_.push_back(std::move(info));
    runtime->contexts_.push_back(std::move(context));
  }
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      absl::Status s = EnablePeerAccess(runtime->contexts_[i], runtime->contexts_[j]);
      if (absl::IsFailedPrecondition(s)) {
        runtime->all_peers_ = false;
      } else if (!s.ok()) {
        return s;
      }
    }
  }
  return runtime;
}

std::string Runtime::Describe() const {
  std::string out;
  for (const DeviceInfo& d : infos_) {
    absl::StrAppend(&out, "GPU ", d.ordinal, ": ", d.name, " (", d.pci_bus_id, ", ",
                    d.total_bytes >> 30, " GiB)\n");
  }
  absl::StrAppend(
      &out, "peer access between every pair of GPUs: ", all_peers_ ? "yes" : "no", "\n");
  return out;
}

}  // namespace fuselink::gpu
