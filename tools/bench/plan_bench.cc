// The planner on its own: PlanExtents and ChunkCursor over a KV cache of 32 layers
// x 1024 blocks, with the block lists a serving engine sends (scattered: nothing
// coalesces; contiguous: one extent per layer).
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "agent/memory/layout.h"
#include "agent/transfer/plan.h"
#include "benchmark/benchmark.h"

namespace fuselink::transfer {
namespace {

constexpr uint32_t kLayers = 32;
constexpr uint32_t kBlocksPerLayer = 1024;
constexpr uint64_t kBlockBytes = 64 << 10;

memory::Layout KvLayout() {
  memory::Layout layout;
  layout.layers = kLayers;
  layout.blocks_per_layer = kBlocksPerLayer;
  layout.block_bytes = kBlockBytes;
  return *memory::NormalizeLayout(layout,
                                  uint64_t{kLayers} * kBlocksPerLayer * kBlockBytes);
}

// `count` distinct block ids: shuffled (scattered) or 0, 1, 2, ... (contiguous).
std::vector<uint32_t> BlockIds(size_t count, bool scattered, uint32_t seed) {
  std::vector<uint32_t> ids(kBlocksPerLayer);
  std::iota(ids.begin(), ids.end(), 0);
  if (scattered) std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  ids.resize(count);
  return ids;
}

// Args: blocks per request, scattered (1) or contiguous (0).
void BM_PlanExtents(benchmark::State& state) {
  const memory::Layout layout = KvLayout();
  const bool scattered = state.range(1) != 0;
  const std::vector<uint32_t> source = BlockIds(state.range(0), scattered, 1);
  const std::vector<uint32_t> target = BlockIds(state.range(0), scattered, 2);
  size_t extents = 0;
  for (auto _ : state) {
    std::vector<Extent> plan = PlanExtents(layout, layout, source, target, 0, kLayers);
    extents = plan.size();
    benchmark::DoNotOptimize(plan.data());
  }
  state.counters["extents"] = static_cast<double>(extents);
  state.counters["blocks/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * source.size() * kLayers,
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PlanExtents)->Args({1024, 1})->Args({1024, 0})->Args({16, 1});

// Args: chunk bytes. Walks the scattered plan of all 1024 blocks x 32 layers.
void BM_ChunkCursor(benchmark::State& state) {
  const memory::Layout layout = KvLayout();
  const std::vector<uint32_t> source = BlockIds(kBlocksPerLayer, true, 1);
  const std::vector<uint32_t> target = BlockIds(kBlocksPerLayer, true, 2);
  const std::vector<Extent> plan =
      PlanExtents(layout, layout, source, target, 0, kLayers);
  const uint32_t chunk_bytes = static_cast<uint32_t>(state.range(0));
  uint64_t chunks = 0;
  for (auto _ : state) {
    ChunkCursor cursor(plan, chunk_bytes);
    Chunk chunk;
    chunks = 0;
    while (cursor.Next(&chunk)) {
      benchmark::DoNotOptimize(chunk);
      ++chunks;
    }
  }
  state.counters["chunks"] = static_cast<double>(chunks);
  state.counters["chunks/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * chunks, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ChunkCursor)->Arg(4096)->Arg(16 << 10)->Arg(1 << 20);

// CountChunks, which Accepted reports before the first chunk moves.
void BM_CountChunks(benchmark::State& state) {
  const memory::Layout layout = KvLayout();
  const std::vector<uint32_t> ids = BlockIds(kBlocksPerLayer, true, 1);
  const std::vector<Extent> plan = PlanExtents(layout, layout, ids, ids, 0, kLayers);
  for (auto _ : state) benchmark::DoNotOptimize(CountChunks(plan, 4096));
}
BENCHMARK(BM_CountChunks);

}  // namespace
}  // namespace fuselink::transfer

BENCHMARK_MAIN();
