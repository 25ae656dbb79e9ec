// Copy bandwidths of one node's GPUs, timed with CUDA events: copy engine and copy
// kernel within a GPU, pinned host <-> device (PCIe), a VMM remap cycle, and with two
// or more GPUs, peer copy and kernel stores into a peer's VMM memory (the relay's D1).
//   gpu_bench [size_mib=1024]
// Prints one line per case: GB/s (10^9 bytes copied per second; a device-to-device copy
// also reads as many bytes as it writes), median of 5 timed runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <vector>

#include "agent/common/status_macros.h"
#include "agent/gpu/copy_kernel.h"
#include "agent/gpu/memory.h"
#include "agent/gpu/stream.h"
#include "agent/gpu/vmm.h"

namespace fuselink::gpu {
namespace {

constexpr int kRuns = 5;
constexpr int kIterationsPerRun = 10;
constexpr size_t kRemapBytes = size_t{64} << 20;
constexpr int kRemapCycles = 50;

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Median GB/s of `enqueue` moving `bytes` per call on `stream`.
absl::StatusOr<double> Bandwidth(Stream& stream, size_t bytes,
                                 const std::function<absl::Status()>& enqueue) {
  std::vector<double> rates;
  for (int run = 0; run < kRuns; ++run) {
    FL_ASSIGN_OR_RETURN(double seconds, TimeOnStream(stream, kIterationsPerRun, enqueue));
    rates.push_back(static_cast<double>(bytes) / seconds / 1e9);
  }
  return Median(rates);
}

void Report(const char* name, size_t bytes, const absl::StatusOr<double>& gb_per_s) {
  if (gb_per_s.ok()) {
    std::printf("%-52s %8zu MiB %9.1f GB/s\n", name, bytes >> 20, *gb_per_s);
  } else {
    std::printf("%-52s %8zu MiB  failed: %s\n", name, bytes >> 20,
                gb_per_s.status().ToString().c_str());
  }
  std::fflush(stdout);
}

// Median microseconds of map + set access + unmap of `kRemapBytes` on GPU `ordinal`'s
// memory, seen from `context`'s GPU.
absl::StatusOr<double> RemapCycleUs(const PrimaryContext& context,
                                    const PrimaryContext& memory_context) {
  FL_ASSIGN_OR_RETURN(VmmMemory memory, VmmMemory::Create(memory_context, kRemapBytes));
  FL_ASSIGN_OR_RETURN(size_t granule, VmmGranule(context));
  FL_ASSIGN_OR_RETURN(VaReservation range,
                      VaReservation::Reserve(context, memory.size_bytes(), granule));
  const int accessor[] = {context.ordinal()};
  std::vector<double> cycles_us;
  for (int i = 0; i < kRemapCycles; ++i) {
    const auto start = std::chrono::steady_clock::now();
    FL_ASSIGN_OR_RETURN(VmmMapping mapping,
                        VmmMapping::Map(context, range.ptr(), memory));
    FL_RETURN_IF_ERROR(SetAccess(context, mapping.ptr(), mapping.size_bytes(), accessor));
    FL_RETURN_IF_ERROR(mapping.Unmap());
    cycles_us.push_back(std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - start)
                            .count());
  }
  return Median(cycles_us);
}

absl::Status Run(size_t bytes) {
  FL_ASSIGN_OR_RETURN(const Driver* driver, Driver::Load());
  FL_ASSIGN_OR_RETURN(int gpus, DeviceCount(*driver));
  std::vector<PrimaryContext> contexts;
  for (int i = 0; i < std::min(gpus, 2); ++i) {
    FL_ASSIGN_OR_RETURN(DeviceInfo info, QueryDevice(*driver, i));
    std::printf("GPU %d: %s (%s), %d SMs\n", i, info.name.c_str(),
                info.pci_bus_id.c_str(), info.multiprocessors);
    FL_ASSIGN_OR_RETURN(PrimaryContext context, PrimaryContext::Retain(*driver, i));
    contexts.push_back(std::move(context));
  }
  const PrimaryContext& gpu0 = contexts[0];
  FL_ASSIGN_OR_RETURN(Stream stream, Stream::Create(gpu0));
  FL_ASSIGN_OR_RETURN(DeviceBuffer source, DeviceBuffer::Allocate(gpu0, bytes));
  FL_ASSIGN_OR_RETURN(DeviceBuffer target, DeviceBuffer::Allocate(gpu0, bytes));
  FL_ASSIGN_OR_RETURN(PinnedHostBuffer host, PinnedHostBuffer::Allocate(gpu0, bytes));
  FL_ASSIGN_OR_RETURN(CopyKernel kernel, CopyKernel::Load(gpu0));
  FL_RETURN_IF_ERROR(stream.Fill(source.ptr(), 0x3C, bytes));  // not zeros

  Report("GPU0 device->device, copy engine", bytes, Bandwidth(stream, bytes, [&] {
           return stream.CopyDeviceToDevice(target.ptr(), source.ptr(), bytes);
         }));
  Report("GPU0 device->device, copy kernel", bytes, Bandwidth(stream, bytes, [&] {
           return kernel.Launch(stream, target.ptr(), source.ptr(), bytes);
         }));
  Report("GPU0 pinned host->device (PCIe)", bytes, Bandwidth(stream, bytes, [&] {
           return stream.CopyHostToDevice(source.ptr(), host.data(), bytes);
         }));
  Report("GPU0 device->pinned host (PCIe)", bytes, Bandwidth(stream, bytes, [&] {
           return stream.CopyDeviceToHost(host.data(), source.ptr(), bytes);
         }));
  {
    FL_ASSIGN_OR_RETURN(VmmBuffer local_vmm, VmmBuffer::Create(gpu0, bytes));
    Report("GPU0 kernel store into own VMM mapping", bytes, Bandwidth(stream, bytes, [&] {
             return kernel.Launch(stream, local_vmm.ptr(), source.ptr(), bytes);
           }));
  }
  absl::StatusOr<double> remap_us = RemapCycleUs(gpu0, gpu0);
  if (remap_us.ok()) {
    std::printf("%-52s %8zu MiB %9.1f us\n", "VMM remap cycle (map+access+unmap), GPU0",
                kRemapBytes >> 20, *remap_us);
  } else {
    std::printf("VMM remap cycle failed: %s\n", remap_us.status().ToString().c_str());
  }

  if (contexts.size() < 2) {
    std::printf(
        "peer copy, remote VMM store: skipped, needs 2 GPUs, this machine has %d\n",
        gpus);
    return absl::OkStatus();
  }
  const PrimaryContext& gpu1 = contexts[1];
  FL_RETURN_IF_ERROR(EnablePeerAccess(gpu0, gpu1));
  FL_RETURN_IF_ERROR(EnablePeerAccess(gpu1, gpu0));
  FL_ASSIGN_OR_RETURN(DeviceBuffer remote, DeviceBuffer::Allocate(gpu1, bytes));
  Report("GPU0->GPU1 peer copy (copy engine)", bytes, Bandwidth(stream, bytes, [&] {
           return stream.CopyPeer(remote.ptr(), gpu1, source.ptr(), gpu0, bytes);
         }));
  Report("GPU1->GPU0 peer copy (copy engine)", bytes, Bandwidth(stream, bytes, [&] {
           return stream.CopyPeer(target.ptr(), gpu0, remote.ptr(), gpu1, bytes);
         }));
  Report("GPU0 kernel store into GPU1 cuMemAlloc memory", bytes,
         Bandwidth(stream, bytes, [&] {
           return kernel.Launch(stream, remote.ptr(), source.ptr(), bytes);
         }));
  const int gpu0_reads[] = {0};
  FL_ASSIGN_OR_RETURN(VmmBuffer remote_vmm, VmmBuffer::Create(gpu1, bytes, gpu0_reads));
  Report("GPU0 kernel store into GPU1 VMM memory (relay D1)", bytes,
         Bandwidth(stream, bytes, [&] {
           return kernel.Launch(stream, remote_vmm.ptr(), source.ptr(), bytes);
         }));
  remap_us = RemapCycleUs(gpu0, gpu1);
  if (remap_us.ok()) {
    std::printf("%-52s %8zu MiB %9.1f us\n", "VMM remap cycle, GPU1 memory seen by GPU0",
                kRemapBytes >> 20, *remap_us);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace fuselink::gpu

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  const absl::Status status = fuselink::gpu::Run(mib << 20);
  if (!status.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", status.ToString().c_str());
    return status.code() == absl::StatusCode::kFailedPrecondition ? 77 : 1;
  }
  return 0;
}
