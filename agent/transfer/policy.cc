#include "agent/transfer/policy.h"

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::transfer {
namespace {

class StaticPolicy final : public Policy {
 public:
  absl::string_view name() const override { return "static"; }
  int Pick(int direct_nic, std::span<const std::atomic<uint32_t>>) override {
    return direct_nic;
  }
};

class StripePolicy final : public Policy {
 public:
  absl::string_view name() const override { return "stripe"; }
  int Pick(int direct_nic, std::span<const std::atomic<uint32_t>> in_flight) override {
    // Least loaded NIC; the scan starts one past the last pick so ties rotate.
    const int n = static_cast<int>(in_flight.size());
    const int start = (next_.fetch_add(1, std::memory_order_relaxed) % n);
    int best = start;
    uint32_t best_load = in_flight[start].load(std::memory_order_relaxed);
    for (int k = 1; k < n; ++k) {
      const int i = (start + k) % n;
      const uint32_t load = in_flight[i].load(std::memory_order_relaxed);
      if (load < best_load) {
        best = i;
        best_load = load;
      }
    }
    return best;
  }

 private:
  std::atomic<uint32_t> next_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(absl::string_view name) {
  if (name == "static") return std::make_unique<StaticPolicy>();
  if (name == "stripe") return std::make_unique<StripePolicy>();
  return WithReason(absl::InvalidArgumentError(absl::StrCat(
                        "unknown policy '", name, "'; choose static or stripe")),
                    "UNKNOWN_POLICY");
}

}  // namespace fuselink::transfer
