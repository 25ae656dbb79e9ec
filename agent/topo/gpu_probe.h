// Where discovery's GPUs come from: the CUDA driver on a GPU node, sysfs where the
// driver is absent (fuselinkctl on a node without libcuda, a fixture), a fake in
// tests. Every probe answers in CUDA ordinal order, so that the agent's GPU i is CUDA
// device i in this process's environment, as the rest of the agent assumes.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/topo/sysfs.h"

namespace fuselink::topo {

struct ProbedGpu {
  int ordinal = 0;         // CUDA device ordinal; equals the position in the answer
  std::string pci_bus_id;  // "0000:1b:00.0", lower case, 4-digit domain
  std::string uuid;        // "GPU-...", empty when unknown
  std::string name;        // product name, empty when unknown
  std::vector<int> peers;  // ordinals it reaches by peer access
};

struct GpuEnumeration {
  std::vector<ProbedGpu> gpus;
  std::vector<std::string> notes;  // for people: what the probe assumed
};

// The two variables the CUDA driver reads; nullopt when unset.
struct CudaEnvironment {
  std::optional<std::string> visible_devices;  // CUDA_VISIBLE_DEVICES
  std::optional<std::string> device_order;     // CUDA_DEVICE_ORDER
  static CudaEnvironment FromProcess();
};

class GpuProbe {
 public:
  virtual ~GpuProbe() = default;
  virtual absl::StatusOr<GpuEnumeration> Enumerate() const = 0;
};

// One entry of CUDA_VISIBLE_DEVICES: an index into the driver's order, or a UUID
// ("GPU-..." or a unique prefix of one).
struct VisibleEntry {
  int index = -1;    // >= 0 for an index entry
  std::string uuid;  // non-empty for a UUID entry, lower case, with "gpu-" prefix
  std::string text;  // the entry as written, whitespace stripped
};

// Parses CUDA_VISIBLE_DEVICES the way the driver reads it (measured on an H200 with
// driver 580): comma-separated entries, each an index — the decimal number at its
// front, so "0abc" and "0x0" are GPU 0 — or a UUID with the prefix "GPU-" in upper
// case; up to the first entry that is neither (the driver ignores that one and every
// later one, "gpu-..." included; `*stopped_at` says which, if given). MIG instances
// ("MIG-...") are refused: FAILED_PRECONDITION, reason MIG_UNSUPPORTED — a MIG slice
// has no peer access or CUDA IPC, which the agent's GPU paths need.
absl::StatusOr<std::vector<VisibleEntry>> ParseCudaVisibleDevices(
    absl::string_view value, std::string* stopped_at = nullptr);

// Which of `base` (GPUs in the driver's enumeration order) are visible, in CUDA
// ordinal order: indices into `base`. Entries past the first one that names no GPU are
// dropped as the driver drops them (noted in `notes`). A GPU named twice ("0,0,1")
// makes the driver's cuInit fail (CUDA_ERROR_INVALID_DEVICE): none is visible, noted.
// A UUID entry that matches several GPUs' UUIDs, or any UUID entry when `base` has no
// UUIDs, is FAILED_PRECONDITION (reason CUDA_VISIBLE_DEVICES).
absl::StatusOr<std::vector<int>> SelectVisible(const std::vector<ProbedGpu>& base,
                                               const CudaEnvironment& env,
                                               std::vector<std::string>* notes);

// The bus ids (lower case) of the NVIDIA display and 3D controllers (vendor 0x10de,
// class 0x0300 or 0x0302) under bus/pci/devices, visible to this process or not, in
// PCI bus order: the machine's GPUs as sysfs shows them.
std::vector<std::string> NvidiaGpuFunctions(const Sysfs& sysfs);

// NvidiaGpuFunctions, CUDA_VISIBLE_DEVICES applied by index. Without
// the driver it knows no UUIDs, names or peers, and cannot rank by speed: it notes
// that its ordinals assume CUDA_DEVICE_ORDER=PCI_BUS_ID.
std::unique_ptr<GpuProbe> MakeSysfsGpuProbe(const Sysfs* sysfs, CudaEnvironment env);

// The CUDA driver (agent/gpu's loader), which applies CUDA_VISIBLE_DEVICES and
// CUDA_DEVICE_ORDER itself; peers from cuDeviceCanAccessPeer. Where the driver does
// not initialise, answers as WithoutCudaDriver.
std::unique_ptr<GpuProbe> MakeCudaGpuProbe(CudaEnvironment env,
                                           std::unique_ptr<GpuProbe> fallback);

// The answer when the CUDA driver failed with `driver_status` (gpu::Driver::Load's).
// When libcuda loaded but cuInit found no device (CUDA_ERROR_NO_DEVICE or
// CUDA_ERROR_INVALID_DEVICE) under a CUDA_VISIBLE_DEVICES that is set, the variable
// hid the GPUs from every CUDA program here: no GPUs, noted, rather than sysfs's
// different answer. Otherwise (no libcuda; no device with the variable unset)
// `fallback`'s GPUs, with a note saying why.
absl::StatusOr<GpuEnumeration> WithoutCudaDriver(const absl::Status& driver_status,
                                                 const CudaEnvironment& env,
                                                 const GpuProbe& fallback);

// The probe for discovery of `sysfs`: the CUDA driver's (falling back to sysfs) when
// `cuda_allowed` and the tree is this machine's own /sys, since the driver answers
// for this machine whatever tree is read; else the sysfs probe, so that a fixture or
// a copied tree is read alone, the same on a GPU host as anywhere.
std::unique_ptr<GpuProbe> MakeGpuProbe(const Sysfs* sysfs, const CudaEnvironment& env,
                                       bool cuda_allowed);

// "0000:1B:00.0" or "00000000:1b:00.0" -> "0000:1b:00.0".
std::string NormalizeBusId(absl::string_view bus_id);

}  // namespace fuselink::topo
