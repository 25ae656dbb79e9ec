// The fixture and helpers the verbs fabric's device tests share: two fabrics in one
// process, "a" on the A ends of the rails and "b" on the B ends.
// FUSELINK_RDMA_RAILS="a0,b0;a1,b1" names each rail's two IPv4 addresses,
// FUSELINK_RDMA_VETHS="vA0,vB0;..." their interfaces (scripts/rdma-vm.sh sets both
// inside its Soft-RoCE VM). Every test skips, saying why, elsewhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agent/fabric/fabric.h"
#include "agent/fabric/verbs/fabric.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"
#include "tests/rdma/rails.h"

namespace fuselink::fabric::testing {

// What b's memory holds before any write: where no write may land, it still holds it.
inline constexpr uint8_t kUntouched = 0xAB;

// The rails of FUSELINK_RDMA_RAILS.
std::vector<Rail> Rails();

// Why the hardware tests cannot run here, or empty.
std::string SkipReason();

std::vector<uint8_t> RandomBytes(size_t bytes, uint32_t seed);

// Also keeps each arrival's peer name (Arrival::peer_name is valid during the call).
// A check, when set, sees each arrival first.
class NamingHandler : public testing::RecordingHandler {
 public:
  void OnArrival(const Arrival& arrival) override {
    {
      absl::MutexLock lock(&mu_);
      if (check_) check_(arrival);
      names_.emplace_back(arrival.peer_name);
    }
    RecordingHandler::OnArrival(arrival);
  }
  void SetCheck(std::function<void(const Arrival&)> check) {
    absl::MutexLock lock(&mu_);
    check_ = std::move(check);
  }
  std::vector<std::string> names() const {
    absl::MutexLock lock(&mu_);
    return names_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);
  std::function<void(const Arrival&)> check_ ABSL_GUARDED_BY(mu_);
};

// Counts how often a CloseWindow's `drained` ran.
class DrainCounter {
 public:
  absl::AnyInvocable<void() &&> Callback() {
    return [this] {
      absl::MutexLock lock(&mu_);
      ++runs_;
    };
  }
  // Waits (kWaitTimeout) until it ran at least `count` times; the number of runs.
  int WaitFor(int count) {
    absl::MutexLock lock(&mu_);
    struct Args {
      const int* runs;
      int count;
    } args{&runs_, count};
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](Args* a) { return *a->runs >= a->count; }, &args),
                         testing::kWaitTimeout);
    return runs_;
  }

 private:
  absl::Mutex mu_;
  int runs_ ABSL_GUARDED_BY(mu_) = 0;
};

// Make(...), and out of the test when it skipped or failed.
#define FL_MAKE(...)                              \
  do {                                            \
    Make(__VA_ARGS__);                            \
    if (HasFatalFailure() || IsSkipped()) return; \
  } while (0)

// Create(...) without the connect, and out of the test when it skipped or failed.
#define FL_MAKE_UNCONNECTED(...)                  \
  do {                                            \
    Create(__VA_ARGS__);                          \
    if (HasFatalFailure() || IsSkipped()) return; \
  } while (0)

// a and b, each on the rails' own ends, with their events recorded. Skips in SetUp
// where SkipReason() says why.
class VerbsFabricTest : public ::testing::Test {
 protected:
  void SetUp() override;
  // Creates a and b over `nic_count` rails; `tune_b` and `tune_a` adjust their options.
  void Create(int nic_count, int qps,
              const std::function<void(VerbsFabricOptions&)>& tune_b = nullptr,
              const std::function<void(VerbsFabricOptions&)>& tune_a = nullptr);
  // Connects a to b.
  void ConnectAB();
  // Create(...), then ConnectAB().
  void Make(int nic_count, int qps,
            const std::function<void(VerbsFabricOptions&)>& tune_b = nullptr,
            const std::function<void(VerbsFabricOptions&)>& tune_a = nullptr);
  // A host region of `memory` on `fabric`.
  RegionKey Region(Fabric& fabric, std::vector<uint8_t>& memory);
  // A window of b's region for `peer`.
  WindowKey Window(RegionKey region, absl::string_view peer, std::vector<Extent> extents);
  // Posts on a, waiting out RESOURCE_EXHAUSTED (back-pressure).
  absl::Status Post(int nic, const WriteOp& op);
  // a's completion of `wr_id`, waiting for it; fails the test if it came twice.
  std::optional<Completion> CompletionOf(uint64_t wr_id);

  testing::KeyRing keys_;  // outlives the fabrics
  testing::RecordingHandler a_events_;
  NamingHandler b_events_;
  std::unique_ptr<Fabric> a_;
  std::unique_ptr<Fabric> b_;
  PeerId b_on_a_ = 0;
  double connect_seconds_ = 0;
};

}  // namespace fuselink::fabric::testing
