#include "agent/topo/gpu_probe.h"

#include <cstdlib>
#include <filesystem>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/common/status_macros.h"
#include "agent/gpu/driver.h"

namespace fuselink::topo {
namespace {

absl::Status VisibleError(absl::string_view why) {
  return WithReason(
      absl::FailedPreconditionError(absl::StrCat("CUDA_VISIBLE_DEVICES: ", why)),
      reasons::kCudaVisibleDevices);
}

std::string EnvNote(const CudaEnvironment& env, absl::string_view who) {
  return absl::StrCat(
      "CUDA_VISIBLE_DEVICES=", env.visible_devices ? *env.visible_devices : "(unset)",
      " CUDA_DEVICE_ORDER=", env.device_order ? *env.device_order : "(unset)", ", ", who);
}

class SysfsGpuProbe : public GpuProbe {
 public:
  SysfsGpuProbe(const Sysfs* sysfs, CudaEnvironment env)
      : sysfs_(sysfs), env_(std::move(env)) {}

  absl::StatusOr<GpuEnumeration> Enumerate() const override {
    GpuEnumeration out;
    std::vector<ProbedGpu> base;
    for (std::string& bdf : NvidiaGpuFunctions(*sysfs_)) {
      ProbedGpu gpu;
      gpu.pci_bus_id = std::move(bdf);
      base.push_back(std::move(gpu));
    }
    if (base.empty()) return out;
    out.notes.push_back(EnvNote(env_, "applied by discovery to the GPUs in sysfs"));
    if (env_.device_order.value_or("FASTEST_FIRST") != "PCI_BUS_ID") {
      out.notes.push_back(
          "GPUs from sysfs: ordinals assume CUDA_DEVICE_ORDER=PCI_BUS_ID; the driver's "
          "FASTEST_FIRST order may differ");
    }
    FL_ASSIGN_OR_RETURN(std::vector<int> visible, SelectVisible(base, env_, &out.notes));
    for (int i : visible) {
      out.gpus.push_back(base[i]);
      out.gpus.back().ordinal = static_cast<int>(out.gpus.size()) - 1;
    }
    return out;
  }

 private:
  const Sysfs* sysfs_;
  CudaEnvironment env_;
};

std::string FormatUuid(const gpu::cu::CUuuid& u) {
  std::string hex;
  for (int i = 0; i < 16; ++i) {
    absl::StrAppendFormat(&hex, "%02x", static_cast<unsigned char>(u.bytes[i]));
  }
  return absl::StrCat("GPU-", hex.substr(0, 8), "-", hex.substr(8, 4), "-",
                      hex.substr(12, 4), "-", hex.substr(16, 4), "-", hex.substr(20));
}

class CudaGpuProbe : public GpuProbe {
 public:
  CudaGpuProbe(CudaEnvironment env, std::unique_ptr<GpuProbe> fallback)
      : env_(std::move(env)), fallback_(std::move(fallback)) {}

  absl::StatusOr<GpuEnumeration> Enumerate() const override {
    if (env_.visible_devices) {  // MIG entries are refused before the driver sees them
      FL_RETURN_IF_ERROR(ParseCudaVisibleDevices(*env_.visible_devices).status());
    }
    absl::StatusOr<const gpu::Driver*> driver = gpu::Driver::Load();
    if (!driver.ok()) return WithoutCudaDriver(driver.status(), env_, *fallback_);
    const gpu::Driver& drv = **driver;
    GpuEnumeration out;
    out.notes.push_back(EnvNote(env_, "applied by the CUDA driver"));
    int count = 0;
    FL_RETURN_IF_ERROR(FL_CU(drv, cuDeviceGetCount, &count));
    std::vector<gpu::cu::CUdevice> devices(count);
    for (int i = 0; i < count; ++i) {
      FL_RETURN_IF_ERROR(FL_CU(drv, cuDeviceGet, &devices[i], i));
      ProbedGpu gpu;
      gpu.ordinal = i;
      char text[128] = {};
      FL_RETURN_IF_ERROR(FL_CU(drv, cuDeviceGetPCIBusId, text, sizeof text, devices[i]));
      gpu.pci_bus_id = NormalizeBusId(text);
      FL_RETURN_IF_ERROR(FL_CU(drv, cuDeviceGetName, text, sizeof text, devices[i]));
      gpu.name = text;
      if (drv.api().cuDeviceGetUuid != nullptr) {
        gpu::cu::CUuuid uuid{};
        FL_RETURN_IF_ERROR(FL_CU(drv, cuDeviceGetUuid, &uuid, devices[i]));
        gpu.uuid = FormatUuid(uuid);
      }
      out.gpus.push_back(std::move(gpu));
    }
    if (count > 0 && drv.api().cuDeviceGetUuid == nullptr) {
      out.notes.push_back("the CUDA driver has no cuDeviceGetUuid: UUIDs unknown");
    }
    for (int a = 0; a < count; ++a) {
      for (int b = 0; b < count; ++b) {
        if (a == b) continue;
        int can = 0;
        FL_RETURN_IF_ERROR(
            FL_CU(drv, cuDeviceCanAccessPeer, &can, devices[a], devices[b]));
        if (can) out.gpus[a].peers.push_back(b);
      }
    }
    return out;
  }

 private:
  CudaEnvironment env_;
  std::unique_ptr<GpuProbe> fallback_;
};

}  // namespace

std::vector<std::string> NvidiaGpuFunctions(const Sysfs& sysfs) {
  std::vector<std::string> out;
  for (const std::string& bdf : sysfs.List("bus/pci/devices")) {
    if (!LooksLikeBdf(bdf)) continue;
    const std::string dir = absl::StrCat("bus/pci/devices/", bdf);
    absl::StatusOr<long long> vendor = sysfs.ReadInt(dir + "/vendor");
    absl::StatusOr<long long> klass = sysfs.ReadInt(dir + "/class");
    if (!vendor.ok() || !klass.ok() || *vendor != 0x10de) continue;
    const long long base_class = *klass >> 8;  // class code without prog-if
    if (base_class != 0x0300 && base_class != 0x0302) continue;
    out.push_back(absl::AsciiStrToLower(bdf));
  }
  return out;
}

CudaEnvironment CudaEnvironment::FromProcess() {
  CudaEnvironment env;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) env.visible_devices = v;
  if (const char* v = std::getenv("CUDA_DEVICE_ORDER")) env.device_order = v;
  return env;
}

std::string NormalizeBusId(absl::string_view bus_id) {
  std::string id = absl::AsciiStrToLower(absl::StripAsciiWhitespace(bus_id));
  const size_t colon = id.find(':');
  if (colon != std::string::npos && colon > 4 && id.size() - colon == 8) {
    id = id.substr(colon - 4);  // 8-digit domain, as nvidia-smi prints
  }
  return id;
}

absl::StatusOr<std::vector<VisibleEntry>> ParseCudaVisibleDevices(
    absl::string_view value, std::string* stopped_at) {
  // Past this many digits an index names no GPU (kMaxGpus is far below); it also keeps
  // the conversion from overflowing.
  constexpr size_t kMaxIndexDigits = 6;
  std::vector<VisibleEntry> entries;
  for (absl::string_view raw : absl::StrSplit(value, ',')) {
    const absl::string_view entry = absl::StripAsciiWhitespace(raw);
    if (absl::StartsWith(entry, "MIG-")) {
      return WithReason(
          absl::FailedPreconditionError(absl::StrCat(
              "CUDA_VISIBLE_DEVICES names a MIG instance ('", entry,
              "'): fuselink needs whole GPUs (peer access and CUDA IPC); give GPU "
              "indices or GPU- UUIDs")),
          reasons::kMigUnsupported);
    }
    VisibleEntry e;
    e.text = std::string(entry);
    size_t digits = 0;
    while (digits < entry.size() && absl::ascii_isdigit(entry[digits])) ++digits;
    int index = -1;
    if (digits > 0 && digits <= kMaxIndexDigits &&
        absl::SimpleAtoi(entry.substr(0, digits), &index)) {
      e.index = index;  // the number at the front, as the driver reads "0abc"
    } else if (digits == 0 && absl::StartsWith(entry, "GPU-") && entry.size() > 4) {
      e.uuid = absl::AsciiStrToLower(entry);
    } else {
      if (stopped_at != nullptr) *stopped_at = std::string(entry);
      break;  // the driver ignores this entry and every later one
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

absl::StatusOr<std::vector<int>> SelectVisible(const std::vector<ProbedGpu>& base,
                                               const CudaEnvironment& env,
                                               std::vector<std::string>* notes) {
  std::vector<int> visible;
  if (!env.visible_devices) {
    for (int i = 0; i < static_cast<int>(base.size()); ++i) visible.push_back(i);
    return visible;
  }
  std::string stopped;
  FL_ASSIGN_OR_RETURN(std::vector<VisibleEntry> entries,
                      ParseCudaVisibleDevices(*env.visible_devices, &stopped));
  absl::flat_hash_set<int> seen;
  for (const VisibleEntry& e : entries) {
    int chosen = -1;
    if (e.index >= 0) {
      if (e.index < static_cast<int>(base.size())) chosen = e.index;
    } else {
      for (int i = 0; i < static_cast<int>(base.size()); ++i) {
        if (base[i].uuid.empty()) {
          return VisibleError(absl::StrCat("'", e.text,
                                           "' names a GPU by UUID, and without the "
                                           "CUDA driver discovery knows no UUIDs"));
        }
        if (absl::StartsWith(absl::AsciiStrToLower(base[i].uuid), e.uuid)) {
          if (chosen >= 0) {
            return VisibleError(absl::StrCat("'", e.text, "' matches several GPUs"));
          }
          chosen = i;
        }
      }
    }
    if (chosen < 0) {
      stopped = e.text;
      break;
    }
    if (!seen.insert(chosen).second) {
      if (notes != nullptr) {
        notes->push_back(absl::StrCat(
            "CUDA_VISIBLE_DEVICES=", *env.visible_devices, " names GPU ", chosen,
            " twice ('", e.text,
            "'): the CUDA driver then finds no GPU (cuInit fails "
            "with CUDA_ERROR_INVALID_DEVICE), so discovery finds none either"));
      }
      return std::vector<int>{};
    }
    if (notes != nullptr && e.index >= 0 && e.text != absl::StrCat(e.index)) {
      notes->push_back(absl::StrCat("CUDA_VISIBLE_DEVICES: entry '", e.text,
                                    "' is read as GPU ", e.index,
                                    ", the number at its front, as the driver reads it"));
    }
    visible.push_back(chosen);
  }
  if (!stopped.empty() && notes != nullptr) {
    notes->push_back(absl::StrCat("CUDA_VISIBLE_DEVICES: entries from '", stopped,
                                  "' on name no GPU and are ignored, as the driver "
                                  "ignores them"));
  }
  return visible;
}

absl::StatusOr<GpuEnumeration> WithoutCudaDriver(const absl::Status& driver_status,
                                                 const CudaEnvironment& env,
                                                 const GpuProbe& fallback) {
  const std::string reason = ReasonOf(driver_status);
  if (env.visible_devices &&
      (reason == "CUDA_ERROR_NO_DEVICE" || reason == "CUDA_ERROR_INVALID_DEVICE")) {
    GpuEnumeration none;
    none.notes.push_back(EnvNote(env, "applied by the CUDA driver"));
    none.notes.push_back(absl::StrCat(
        "the CUDA driver loaded but shows no GPU under this CUDA_VISIBLE_DEVICES (",
        driver_status.message(), "): no GPUs, as every CUDA program here sees none"));
    return none;
  }
  FL_ASSIGN_OR_RETURN(GpuEnumeration out, fallback.Enumerate());
  out.notes.insert(out.notes.begin(),
                   absl::StrCat("CUDA driver not usable (", driver_status.message(),
                                "): GPUs from sysfs"));
  return out;
}

std::unique_ptr<GpuProbe> MakeSysfsGpuProbe(const Sysfs* sysfs, CudaEnvironment env) {
  return std::make_unique<SysfsGpuProbe>(sysfs, std::move(env));
}

std::unique_ptr<GpuProbe> MakeGpuProbe(const Sysfs* sysfs, const CudaEnvironment& env,
                                       bool cuda_allowed) {
  std::unique_ptr<GpuProbe> from_sysfs = MakeSysfsGpuProbe(sysfs, env);
  std::error_code ec;
  const bool system_sysfs = std::filesystem::equivalent(sysfs->root(), "/sys", ec) && !ec;
  if (!cuda_allowed || !system_sysfs) return from_sysfs;
  return MakeCudaGpuProbe(env, std::move(from_sysfs));
}

std::unique_ptr<GpuProbe> MakeCudaGpuProbe(CudaEnvironment env,
                                           std::unique_ptr<GpuProbe> fallback) {
  return std::make_unique<CudaGpuProbe>(std::move(env), std::move(fallback));
}

}  // namespace fuselink::topo
