// fuselink-relay-bench: the GPU relay path's parts, timed on the GPUs of this machine,
// with the network taken out.
//
//  copy  The relay stage (GpuRelayPool::Stage, D1 kernel and D2 copy engine) as the
//        engine and the fabric use it: --depth slots on NIC 1 (GPU 1) in turn, each
//        chunk staged, and a slot's fence waited for (as the fabric waits before it
//        reads the slot) before the slot is staged again. Against a plain copy-engine
//        peer copy of the same chunks, pipelined, from GPU 0 into GPU 1.
//  remap What growing and shrinking the pool costs: --remap_slots slots of one 4 MiB
//        chunk made on GPU 1 (VMM allocation, map, access for every GPU, fabric
//        registration) and freed again (deregistration, unmap, release).
//  sink  The PCIe argument: a sink fabric that consumes staged chunks. Each NIC has
//        --threads sender threads with the TCP fabric's own device stage (two pinned
//        buffers, pieces of --piece_mib); a chunk on NIC 0 leaves through GPU 0's PCIe
//        link, a chunk on NIC k > 0 is first staged into a relay slot on GPU k and
//        leaves through GPU k's. The source is always GPU 0. Rows: 1 NIC (GPU 0's link
//        alone) up to every GPU's NIC.
// Prints one JSON object per row.
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/tcp/fabric.h"
#include "agent/gpu/memory.h"
#include "agent/gpu/runtime.h"
#include "agent/gpu/stream.h"
#include "agent/relay/device_stager.h"
#include "agent/relay/gpu_relay_pool.h"

ABSL_FLAG(int, gpus, 0, "GPUs to use; 0: all.");
ABSL_FLAG(std::vector<std::string>, chunk_mib,
          (std::vector<std::string>{"1", "4", "16", "64"}),
          "Chunk sizes of the copy rows (MiB).");
ABSL_FLAG(int, depth, 2,
          "Relay slots in use at once in the copy rows (the agent's --borrow_depth).");
ABSL_FLAG(int, sink_chunk_mib, 4, "Chunk size of the sink rows (MiB).");
ABSL_FLAG(int, piece_mib, 2, "Stage piece size of the sink rows (MiB).");
ABSL_FLAG(int, threads, 2, "Sender threads per NIC in the sink rows.");
ABSL_FLAG(double, seconds, 1.0, "Duration of each sink row.");
ABSL_FLAG(int, source_gib, 2, "Source tensor size on GPU 0 (GiB).");
ABSL_FLAG(int, remap_slots, 64, "Slots made and freed in the remap row.");

namespace fuselink {
namespace {

class NullHandler final : public fabric::Handler {
 public:
  void OnCompletion(const fabric::Completion&) override {}
  void OnArrival(const fabric::Arrival&) override {}
  void OnPeerLost(fabric::PeerId, absl::string_view, const absl::Status&) override {}
};

struct Setup {
  std::unique_ptr<gpu::Runtime> runtime;
  gpu::CopyBound bound{absl::Seconds(10)};
  std::unique_ptr<relay::CudaDeviceStager> stager;
  NullHandler handler;
  fabric::FabricKeys keys;  // outlives the fabric
  std::unique_ptr<fabric::Fabric> fabric;
  std::unique_ptr<gpu::DeviceBuffer> source;
};

absl::Status RunCopy(Setup& s, relay::GpuRelayPool& d1, relay::GpuRelayPool& d2) {
  const gpu::PrimaryContext& g0 = s.runtime->context(0);
  FL_ASSIGN_OR_RETURN(gpu::DeviceBuffer target,
                      gpu::DeviceBuffer::Allocate(s.runtime->context(1), 64 << 20));
  FL_ASSIGN_OR_RETURN(gpu::Stream stream, gpu::Stream::Create(g0));
  for (const std::string& mib_text : absl::GetFlag(FLAGS_chunk_mib)) {
    const uint64_t chunk = std::stoull(mib_text) << 20;
    const int iterations = static_cast<int>(std::max<uint64_t>(32, (8ull << 30) / chunk));
    const uint64_t span = s.source->size_bytes() / chunk * chunk;
    // Plain peer copy, pipelined on one stream.
    int i = 0;
    FL_ASSIGN_OR_RETURN(
        double peer_s, gpu::TimeOnStream(stream, iterations, [&] {
          const uint64_t off = (uint64_t{static_cast<unsigned>(i++)} * chunk) % span;
          return stream.CopyDeviceToDevice(target.ptr(), s.source->ptr() + off, chunk);
        }));
    double stage_gbps[2] = {0, 0};
    relay::GpuRelayPool* pools[2] = {&d1, &d2};
    const int depth = absl::GetFlag(FLAGS_depth);
    for (int p = 0; p < 2; ++p) {
      std::vector<relay::Slot> slots;
      for (int d = 0; d < depth; ++d) {
        slots.push_back(pools[p]->Acquire(1));  // NIC 1: slots on GPU 1
        if (!slots.back().valid()) return absl::ResourceExhaustedError("no relay slot");
      }
      const relay::Source warm{reinterpret_cast<const uint8_t*>(s.source->ptr()), 0};
      for (const relay::Slot& slot : slots) {
        FL_RETURN_IF_ERROR(pools[p]->Stage(slot, warm, static_cast<uint32_t>(chunk)));
        FL_RETURN_IF_ERROR(slot.ready->Wait());
      }
      const absl::Time start = absl::Now();
      for (int n = 0; n < iterations; ++n) {
        const relay::Slot& slot = slots[n % depth];
        if (n >= depth) FL_RETURN_IF_ERROR(slot.ready->Wait());
        const uint64_t off = (uint64_t{static_cast<unsigned>(n)} * chunk) % span;
        const relay::Source from{reinterpret_cast<const uint8_t*>(s.source->ptr() + off),
                                 0};
        FL_RETURN_IF_ERROR(pools[p]->Stage(slot, from, static_cast<uint32_t>(chunk)));
      }
      for (const relay::Slot& slot : slots) FL_RETURN_IF_ERROR(slot.ready->Wait());
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      stage_gbps[p] = static_cast<double>(chunk) * iterations / seconds / 1e9;
      for (const relay::Slot& slot : slots) pools[p]->Release(slot);
    }
    const double peer_gbps = static_cast<double>(chunk) / peer_s / 1e9;
    std::printf(
        "{\"row\":\"copy\",\"chunk_mib\":%s,\"depth\":%d,\"peer_copy_gbps\":%.1f,"
        "\"d1_gbps\":%.1f,\"d2_gbps\":%.1f,\"d1_ratio\":%.3f,\"d2_ratio\":%.3f}\n",
        mib_text.c_str(), depth, peer_gbps, stage_gbps[0], stage_gbps[1],
        stage_gbps[0] / peer_gbps, stage_gbps[1] / peer_gbps);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status RunRemap(Setup& s, const std::vector<int>& nic_gpu) {
  relay::GpuRelayOptions options;
  options.slot_bytes = 4 << 20;
  options.cap_bytes_per_gpu = uint64_t{64} << 30;
  options.min_free_bytes = 0;
  options.idle = absl::ZeroDuration();
  FL_ASSIGN_OR_RETURN(
      auto pool, relay::GpuRelayPool::Create(s.fabric.get(), s.runtime.get(), &s.bound,
                                             nic_gpu, options));
  const int n = absl::GetFlag(FLAGS_remap_slots);
  const int nic = s.runtime->count() > 1 ? 1 : 0;
  std::vector<relay::Slot> slots;
  const absl::Time start = absl::Now();
  for (int i = 0; i < n; ++i) {
    slots.push_back(pool->Acquire(nic));
    if (!slots.back().valid()) return absl::ResourceExhaustedError("no relay slot");
  }
  const absl::Time made = absl::Now();
  for (const relay::Slot& slot : slots) pool->Release(slot);
  const absl::Time released = absl::Now();
  pool->Maintain(absl::Now() + absl::Seconds(1));
  const absl::Time freed = absl::Now();
  if (pool->held_bytes() != 0) return absl::InternalError("slots left after Maintain");
  std::printf(
      "{\"row\":\"remap\",\"slots\":%d,\"slot_mib\":4,\"map_us_per_slot\":%.1f,"
      "\"unmap_us_per_slot\":%.1f,\"remaps\":%llu}\n",
      n, absl::ToDoubleMicroseconds(made - start) / n,
      absl::ToDoubleMicroseconds(freed - released) / n,
      static_cast<unsigned long long>(pool->remaps()));
  std::fflush(stdout);
  return absl::OkStatus();
}

// One sender thread of NIC `nic`: chunks of the source until `stop`, out through the
// stage (to the sink), via a relay slot on the NIC's GPU when nic > 0.
absl::Status Sender(Setup& s, relay::GpuRelayPool* pool, int nic, uint64_t chunk,
                    uint64_t first_chunk, std::atomic<bool>& stop,
                    std::atomic<uint64_t>& moved) {
  FL_ASSIGN_OR_RETURN(std::unique_ptr<fabric::DeviceStage> stage,
                      s.stager->NewStage(nic));
  const uint32_t piece = stage->piece_bytes();
  const uint64_t span = s.source->size_bytes() / chunk * chunk;
  relay::Slot slot;
  if (nic > 0) {
    slot = pool->Acquire(nic);
    if (!slot.valid()) return absl::ResourceExhaustedError("no relay slot");
  }
  for (uint64_t n = first_chunk; !stop.load(std::memory_order_relaxed); n += 7) {
    uint64_t from = s.source->ptr() + (n * chunk) % span;
    int gpu = 0;
    if (nic > 0) {
      FL_RETURN_IF_ERROR(pool->Stage(slot, {reinterpret_cast<const uint8_t*>(from), 0},
                                     static_cast<uint32_t>(chunk)));
      FL_RETURN_IF_ERROR(slot.ready->Wait());  // as the fabric does
      from = reinterpret_cast<uintptr_t>(slot.data);
      gpu = s.runtime->count() > nic ? nic : 0;
    }
    // As TcpConnection::SendFromDevice, with the socket replaced by the sink.
    FL_RETURN_IF_ERROR(
        stage->StartToHost(gpu, from, 0, std::min<uint64_t>(piece, chunk)));
    for (uint64_t at = 0, i = 0; at < chunk; at += piece, ++i) {
      const uint64_t len = std::min<uint64_t>(piece, chunk - at);
      FL_RETURN_IF_ERROR(stage->Wait());
      if (at + len < chunk) {
        FL_RETURN_IF_ERROR(
            stage->StartToHost(gpu, from + at + len, (i + 1) % 2,
                               std::min<uint64_t>(piece, chunk - at - len)));
      }
    }
    moved.fetch_add(chunk, std::memory_order_relaxed);
  }
  if (slot.valid()) pool->Release(slot);
  return absl::OkStatus();
}

absl::Status RunSink(Setup& s, relay::GpuRelayPool& pool, const char* mode) {
  const uint64_t chunk = uint64_t(absl::GetFlag(FLAGS_sink_chunk_mib)) << 20;
  const int threads = absl::GetFlag(FLAGS_threads);
  double single = 0;
  for (int nics = 1; nics <= s.runtime->count(); ++nics) {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> moved{0};
    std::vector<absl::Status> results(nics * threads);
    std::vector<std::thread> workers;
    for (int k = 0; k < nics; ++k) {
      for (int t = 0; t < threads; ++t) {
        const int w = k * threads + t;
        workers.emplace_back([&, k, w] {
          results[w] = Sender(s, &pool, k, chunk, static_cast<uint64_t>(w), stop, moved);
        });
      }
    }
    const absl::Time start = absl::Now();
    absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_seconds)));
    const uint64_t bytes = moved.load();
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    stop.store(true);
    for (auto& w : workers) w.join();
    for (const absl::Status& r : results) FL_RETURN_IF_ERROR(r);
    const double gbps = static_cast<double>(bytes) / seconds / 1e9;
    if (nics == 1) single = gbps;
    std::printf(
        "{\"row\":\"sink\",\"stage\":\"%s\",\"nics\":%d,\"threads_per_nic\":%d,"
        "\"chunk_mib\":%d,\"gbps\":%.1f,\"per_single_link\":%.2f}\n",
        mode, nics, threads, absl::GetFlag(FLAGS_sink_chunk_mib), gbps, gbps / single);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::Status Run() {
  Setup s;
  int want = absl::GetFlag(FLAGS_gpus);
  FL_ASSIGN_OR_RETURN(s.runtime, gpu::Runtime::Open(want > 0 ? want : 64));
  const int g = s.runtime->count();
  std::fprintf(stderr, "%s", s.runtime->Describe().c_str());
  std::vector<int> nic_gpu(g);
  for (int k = 0; k < g; ++k) nic_gpu[k] = k;
  s.stager = std::make_unique<relay::CudaDeviceStager>(
      s.runtime.get(), &s.bound, nic_gpu, uint32_t(absl::GetFlag(FLAGS_piece_mib)) << 20);
  fabric::TcpFabricOptions options;
  options.node_name = "relay-bench";
  for (int k = 0; k < g; ++k) options.nics.push_back({k, "127.0.0.1", 0});
  options.device_stager = s.stager.get();
  options.keys = &s.keys;
  FL_ASSIGN_OR_RETURN(s.fabric, fabric::CreateTcpFabric(options, &s.handler));
  FL_ASSIGN_OR_RETURN(
      gpu::DeviceBuffer source,
      gpu::DeviceBuffer::Allocate(s.runtime->context(0),
                                  uint64_t(absl::GetFlag(FLAGS_source_gib)) << 30));
  s.source = std::make_unique<gpu::DeviceBuffer>(std::move(source));
  gpu::Stream fill = *gpu::Stream::Create(s.runtime->context(0));
  FL_RETURN_IF_ERROR(fill.Fill(s.source->ptr(), 0x5a, s.source->size_bytes()));
  FL_RETURN_IF_ERROR(fill.Synchronize());

  uint64_t max_chunk = uint64_t(absl::GetFlag(FLAGS_sink_chunk_mib)) << 20;
  for (const std::string& m : absl::GetFlag(FLAGS_chunk_mib)) {
    max_chunk = std::max<uint64_t>(max_chunk, std::stoull(m) << 20);
  }
  relay::GpuRelayOptions relay_options;
  relay_options.slot_bytes = static_cast<uint32_t>(max_chunk);
  relay_options.cap_bytes_per_gpu = uint64_t{4} << 30;
  relay_options.min_free_bytes = 0;
  relay_options.mode = relay::StageMode::kKernel;
  FL_ASSIGN_OR_RETURN(
      auto d1, relay::GpuRelayPool::Create(s.fabric.get(), s.runtime.get(), &s.bound,
                                           nic_gpu, relay_options));
  relay_options.mode = relay::StageMode::kCopyEngine;
  FL_ASSIGN_OR_RETURN(
      auto d2, relay::GpuRelayPool::Create(s.fabric.get(), s.runtime.get(), &s.bound,
                                           nic_gpu, relay_options));
  if (g >= 2) {
    FL_RETURN_IF_ERROR(RunCopy(s, *d1, *d2));
  } else {
    std::fprintf(stderr, "copy rows need two GPUs; this machine has %d\n", g);
  }
  FL_RETURN_IF_ERROR(RunRemap(s, nic_gpu));
  FL_RETURN_IF_ERROR(RunSink(s, *d1, "d1"));
  FL_RETURN_IF_ERROR(RunSink(s, *d2, "d2"));
  return absl::OkStatus();
}

}  // namespace
}  // namespace fuselink

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status s = fuselink::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "fuselink-relay-bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
