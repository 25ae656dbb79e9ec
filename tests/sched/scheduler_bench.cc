// Scheduling cost per chunk: one Pick and its Complete, on the paths that matter.
#include <benchmark/benchmark.h>

#include <vector>

#include "agent/sched/scheduler.h"

namespace fuselink::sched {
namespace {

constexpr int kNics = 8;

// The direct NIC has room: the common case.
void BM_PickDirect(benchmark::State& state) {
  Scheduler s(Policy::kFuselink, kNics, Limits{4, 2});
  for (auto _ : state) {
    Choice c = s.Pick(0, 0xFF);
    benchmark::DoNotOptimize(c);
    s.Complete(c, 1 << 20);
  }
}
BENCHMARK(BM_PickDirect);

// The direct NIC is full: a scan of 8 NICs for the least loaded idle one.
void BM_PickBorrowed(benchmark::State& state) {
  Scheduler s(Policy::kFuselink, kNics, Limits{1, 2});
  const Choice hold = s.Pick(0, 0xFF);
  for (auto _ : state) {
    Choice c = s.Pick(0, 0xFF);
    benchmark::DoNotOptimize(c);
    s.Complete(c, 1 << 20);
  }
  s.Complete(hold, 0);
}
BENCHMARK(BM_PickBorrowed);

// A short transfer (16 chunks left) whose direct NIC holds its share: the share is
// worked out (the idle mask read), then a borrow.
void BM_PickShareThenBorrowed(benchmark::State& state) {
  Scheduler s(Policy::kFuselink, kNics, Limits{8, 2});
  const Choice hold[] = {s.Pick(0, 0xFF, ~0u, 16), s.Pick(0, 0xFF, ~0u, 16)};
  for (auto _ : state) {
    Choice c = s.Pick(0, 0xFF, ~0u, 16);
    benchmark::DoNotOptimize(c);
    s.Complete(c, 1 << 20);
  }
  for (const Choice& c : hold) s.Complete(c, 0);
}
BENCHMARK(BM_PickShareThenBorrowed);

// Everything full: the answer is "wait".
void BM_PickNone(benchmark::State& state) {
  Scheduler s(Policy::kFuselink, kNics, Limits{1, 1});
  for (int i = 0; i < 8; ++i) s.Pick(0, 0xFF);
  for (auto _ : state) benchmark::DoNotOptimize(s.Pick(0, 0xFF));
}
BENCHMARK(BM_PickNone);

void BM_PickStripe(benchmark::State& state) {
  Scheduler s(Policy::kStripe, kNics, Limits{});
  for (auto _ : state) {
    Choice c = s.Pick(0, 0xFF);
    benchmark::DoNotOptimize(c);
    s.Complete(c, 1 << 20);
  }
}
BENCHMARK(BM_PickStripe);

}  // namespace
}  // namespace fuselink::sched

BENCHMARK_MAIN();
