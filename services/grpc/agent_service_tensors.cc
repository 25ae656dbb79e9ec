// The Agent service's tensor calls (the class: agent_service.h): RegisterTensor and
// UnregisterTensor, whose mapping and registering run on the caller's lane of the
// node's registrations pool, and GetTensor and ListTensors, answered on gRPC's
// thread. A request's memory is checked in full (kinds, GPUs, sizes, the owner's
// token) before any descriptor token is spent.
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/gpu/ipc.h"
#include "agent/gpu/vmm.h"
#include "agent/memory/host_mapping.h"
#include "agent/transfer/layout_proto.h"
#include "services/grpc/agent_service.h"
#include "services/grpc/agent_service_internal.h"
#include "services/grpc/answer_off_thread.h"

namespace fuselink::services {
namespace {

using agent_service_internal::kSeeAll;
using security::Bit;
using security::Role;

// Who may move a tensor when its owner names nobody: the cluster's routers.
constexpr absl::string_view kDefaultGrant = "role:router";

void ToProto(const memory::TensorInfo& info, absl::string_view node, v1::Tensor* out) {
  out->set_name(info.name);
  transfer::LayoutToProto(info.layout, out->mutable_layout());
  out->set_memory_kind(info.memory_kind);
  out->set_size_bytes(info.size_bytes);
  *out->mutable_region_bytes() = {info.region_bytes.begin(), info.region_bytes.end()};
  out->set_home_gpu(info.home_gpu);
  out->set_node(std::string(node));
  out->set_owner(info.owner);
  *out->mutable_readers() = {info.readers.begin(), info.readers.end()};
  *out->mutable_writers() = {info.writers.begin(), info.writers.end()};
  if (info.lender.known) {
    out->set_lender_pid(static_cast<uint32_t>(info.lender.pid));
    out->set_lender_uid(info.lender.uid);
    out->set_lender_gid(info.lender.gid);
  }
}

// A handle the driver refused: INVALID_ARGUMENT (BAD_GPU_HANDLE) with the driver's
// words; out of memory and a dead context keep their own codes.
absl::Status HandleRefused(const absl::Status& status) {
  if (!absl::IsInvalidArgument(status)) return status;
  return WithReason(absl::InvalidArgumentError(status.message()), reasons::kBadGpuHandle);
}

// Whose lane of the registration pool a call takes: its caller's (open access knows no
// identities: a lane per connection).
std::string RegistrationLane(const grpc::CallbackServerContext& context,
                             const security::Caller& caller) {
  return caller.identity.empty() ? context.peer() : caller.identity;
}

}  // namespace

grpc::ServerUnaryReactor* AgentService::RegisterTensor(
    grpc::CallbackServerContext* context, const v1::RegisterTensorRequest* request,
    v1::Tensor* response) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, Bit(Role::kEngine), "register tensors");
  if (!caller.ok()) return Answer(context, caller.status());
  // Mapping, populating and registering memory blocks: on the caller's own lane of
  // the node's pool.
  return AnswerOffThread(
      *parts_.registrations, RegistrationLane(*context, *caller),
      [this, request, response, caller = *std::move(caller)]() -> absl::Status {
        absl::StatusOr<memory::TensorInfo> info = Register(*request, caller);
        if (!info.ok()) return info.status();
        ToProto(*info, parts_.node, response);
        return absl::OkStatus();
      });
}

namespace {

uint32_t GpuOf(const v1::TensorMemory& memory, uint32_t home_gpu) {
  switch (memory.kind_case()) {
    case v1::TensorMemory::kCudaIpc:
      return memory.cuda_ipc().gpu();
    case v1::TensorMemory::kVmm:
      return memory.vmm().gpu();
    default:
      return home_gpu;
  }
}

uint64_t SizeOf(const v1::TensorMemory& memory) {
  switch (memory.kind_case()) {
    case v1::TensorMemory::kHost:
      return memory.host().size_bytes();
    case v1::TensorMemory::kCudaIpc:
      return memory.cuda_ipc().size_bytes();
    case v1::TensorMemory::kVmm:
      return memory.vmm().size_bytes();
    default:
      return 0;
  }
}

absl::Status BadMemory(absl::string_view why) {
  return WithReason(absl::InvalidArgumentError(why), reasons::kBadMemory);
}

// The memory regions a request lends: `memory`, or `regions`, all of one kind on one
// GPU, each of a size the layout may name.
absl::StatusOr<std::vector<const v1::TensorMemory*>> RegionsOf(
    const v1::RegisterTensorRequest& request) {
  if (request.has_memory() == (request.regions_size() > 0)) {
    return BadMemory("give memory or regions, one of them");
  }
  if (static_cast<size_t>(request.regions_size()) > memory::kMaxRegions) {
    return BadMemory(
        absl::StrCat(request.regions_size(), " regions; at most ", memory::kMaxRegions));
  }
  std::vector<const v1::TensorMemory*> regions;
  if (request.has_memory()) regions.push_back(&request.memory());
  for (const v1::TensorMemory& m : request.regions()) regions.push_back(&m);
  const v1::TensorMemory& first = *regions.front();
  for (size_t i = 0; i < regions.size(); ++i) {
    const v1::TensorMemory& m = *regions[i];
    const std::string which =
        request.has_memory() ? "memory" : absl::StrCat("regions[", i, "]");
    if (m.kind_case() == v1::TensorMemory::KIND_NOT_SET) {
      return BadMemory(absl::StrCat(which, " names no memory"));
    }
    if (m.kind_case() != first.kind_case() ||
        GpuOf(m, request.home_gpu()) != GpuOf(first, request.home_gpu())) {
      return BadMemory(absl::StrCat(which, " is not of the kind and GPU of regions[0]"));
    }
    if (m.kind_case() != v1::TensorMemory::kHost && SizeOf(m) == 0) {
      return BadMemory(absl::StrCat(which, ": GPU memory needs size_bytes"));
    }
    if (SizeOf(m) > memory::kMaxRegionBytes) {
      return BadMemory(absl::StrCat(which, ": over ", memory::kMaxRegionBytes, " bytes"));
    }
    if (m.kind_case() == v1::TensorMemory::kCudaIpc &&
        m.cuda_ipc().handle().size() != sizeof(gpu::IpcMemHandle)) {
      return WithReason(absl::InvalidArgumentError(absl::StrCat(
                            which, ": cuda_ipc.handle has ", m.cuda_ipc().handle().size(),
                            " bytes; a CUDA IPC handle has ", sizeof(gpu::IpcMemHandle))),
                        reasons::kBadGpuHandle);
    }
  }
  return regions;
}

// A CUDA IPC handle is 64 bytes that anyone holding them may open on this node: it is
// taken only with a token that the handle socket gave a local process whose
// credentials it checked (docs/security.md), never from the gRPC request alone.
// PERMISSION_DENIED (OWNER_TOKEN_REQUIRED) otherwise. Pure.
absl::Status CheckIpcLender(const v1::RegisterTensorRequest& request,
                            const v1::TensorMemory& first) {
  if (first.kind_case() != v1::TensorMemory::kCudaIpc || request.owner_fd_token() != 0) {
    return absl::OkStatus();
  }
  return WithReason(absl::PermissionDeniedError(
                        "cuda_ipc memory needs owner_fd_token: a pidfd of the lending "
                        "process, passed over this node's handle socket"),
                    reasons::kOwnerTokenRequired);
}

}  // namespace

absl::StatusOr<memory::RegionMemory> AgentService::Import(const v1::TensorMemory& memory,
                                                          const ImportOwner& owner,
                                                          memory::Lender* lender) {
  switch (memory.kind_case()) {
    case v1::TensorMemory::kHost: {
      const v1::HostMemory& host = memory.host();
      FL_ASSIGN_OR_RETURN(memory::LentFd lent, parts_.fd_tokens->Take(host.fd_token()));
      if (!lender->known) *lender = lent.lender;
      // Two mappings of one file are the same memory: known by its device and inode.
      struct stat file;
      if (fstat(lent.fd.get(), &file) != 0) return BadMemory("the memory's file is gone");
      const memory::MemoryExtent extent{.file = {static_cast<uint64_t>(file.st_dev),
                                                 static_cast<uint64_t>(file.st_ino)},
                                        .begin = host.offset_bytes(),
                                        .bytes = host.size_bytes()};
      FL_ASSIGN_OR_RETURN(
          std::shared_ptr<memory::HostMapping> mapping,
          memory::HostMapping::Map(std::move(lent.fd), host.offset_bytes(),
                                   host.size_bytes()));
      auto* base = static_cast<uint8_t*>(mapping->data());
      return memory::RegionMemory{base, host.size_bytes(), std::move(mapping), extent};
    }
    case v1::TensorMemory::kCudaIpc: {
      const v1::CudaIpcMemory& ipc = memory.cuda_ipc();
      gpu::IpcMemHandle handle;
      std::memcpy(handle.data(), ipc.handle().data(), handle.size());
      const int gpu = static_cast<int>(ipc.gpu());
      absl::StatusOr<std::shared_ptr<const gpu::IpcImport>> import =
          parts_.ipc_imports->Open(gpu, parts_.gpu->context(gpu), handle, owner);
      if (!import.ok()) return HandleRefused(import.status());
      const std::shared_ptr<const gpu::IpcImport>& held = *import;
      FL_RETURN_IF_ERROR(gpu::CheckSubrange(held->allocation_bytes(), ipc.offset_bytes(),
                                            ipc.size_bytes()));
      return memory::RegionMemory{.base = reinterpret_cast<uint8_t*>(
                                      held->allocation_base() + ipc.offset_bytes()),
                                  .bytes = ipc.size_bytes(),
                                  .keepalive = held,
                                  .extent = {}};
    }
    case v1::TensorMemory::kVmm: {
      const v1::VmmMemory& vmm = memory.vmm();
      FL_ASSIGN_OR_RETURN(memory::LentFd lent, parts_.fd_tokens->Take(vmm.fd_token()));
      if (!lender->known) *lender = lent.lender;
      const UniqueFd fd = std::move(lent.fd);
      const gpu::PrimaryContext& ctx = parts_.gpu->context(static_cast<int>(vmm.gpu()));
      uint64_t allocation = vmm.allocation_bytes();
      if (allocation == 0) {
        FL_ASSIGN_OR_RETURN(size_t granule, gpu::VmmGranule(ctx));
        FL_ASSIGN_OR_RETURN(
            allocation,
            gpu::RoundUpToGranule(vmm.offset_bytes() + vmm.size_bytes(), granule));
      }
      FL_RETURN_IF_ERROR(
          gpu::CheckSubrange(allocation, vmm.offset_bytes(), vmm.size_bytes()));
      absl::StatusOr<gpu::VmmBuffer> buffer =
          gpu::VmmBuffer::ImportFd(ctx, fd.get(), allocation);
      if (!buffer.ok()) return HandleRefused(buffer.status());
      auto held = std::make_shared<gpu::VmmBuffer>(std::move(*buffer));
      return memory::RegionMemory{
          .base = reinterpret_cast<uint8_t*>(held->ptr() + vmm.offset_bytes()),
          .bytes = vmm.size_bytes(),
          .keepalive = held,
          .extent = {}};
    }
    default:
      return BadMemory("unknown memory kind");
  }
}

absl::StatusOr<memory::TensorInfo> AgentService::Register(
    const v1::RegisterTensorRequest& request, const security::Caller& caller) {
  FL_ASSIGN_OR_RETURN(std::vector<const v1::TensorMemory*> regions, RegionsOf(request));
  const v1::TensorMemory& first = *regions.front();
  if (absl::Status lender = CheckIpcLender(request, first); !lender.ok()) {
    parts_.ipc_imports->CountNoOwnerToken();
    return lender;
  }
  const bool on_gpu = first.kind_case() != v1::TensorMemory::kHost;
  const uint32_t gpu = GpuOf(first, request.home_gpu());
  if (gpu >= static_cast<uint32_t>(parts_.topology->gpus_size())) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(on_gpu ? "gpu " : "home_gpu ", gpu,
                                                " does not exist on this node")),
        reasons::kBadHomeGpu);
  }
  // Check the request itself, then this node, before spending the tokens.
  FL_RETURN_IF_ERROR(memory::ValidateName(request.name()));
  std::vector<std::string> readers(request.readers().begin(), request.readers().end());
  std::vector<std::string> writers(request.writers().begin(), request.writers().end());
  FL_RETURN_IF_ERROR(security::ValidateGrants(readers, "readers"));
  FL_RETURN_IF_ERROR(security::ValidateGrants(writers, "writers"));
  if (readers.empty() && writers.empty()) {
    readers = writers = {std::string(kDefaultGrant)};
  }
  FL_ASSIGN_OR_RETURN(memory::Layout layout, transfer::LayoutFromProto(request.layout()));
  // The layout must fit the sizes the request declares, before any token is spent.
  std::vector<uint64_t> sizes;
  for (const v1::TensorMemory* m : regions) sizes.push_back(SizeOf(*m));
  FL_ASSIGN_OR_RETURN(layout, memory::NormalizeLayout(std::move(layout), sizes));
  const gpu::Runtime* runtime = parts_.gpu;
  if (on_gpu && (runtime == nullptr || !runtime->has(static_cast<int>(gpu)))) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "GPU ", gpu, " is not a CUDA device of this agent (",
                          parts_.gpu_status, ")")),
                      reasons::kNoGpu);
  }
  // The lender is who passed the memory's descriptor, else who passed the owner's
  // pidfd: the kernel's word for both (memory::Lender), not the request's.
  UniqueFd owner;
  memory::Lender owner_lender;
  if (request.owner_fd_token() != 0) {
    FL_ASSIGN_OR_RETURN(memory::LentFd lent,
                        parts_.fd_tokens->Take(request.owner_fd_token()));
    owner = std::move(lent.fd);
    owner_lender = lent.lender;
  }
  memory::Lender lender;  // of the first region lent by descriptor
  // Whose CUDA IPC imports these are: never shared with another (ipc_imports.h).
  const ImportOwner ipc_owner{.identity = caller.identity, .pid = owner_lender.pid};
  std::vector<memory::RegionMemory> imported;
  for (const v1::TensorMemory* m : regions) {
    FL_ASSIGN_OR_RETURN(memory::RegionMemory region, Import(*m, ipc_owner, &lender));
    imported.push_back(std::move(region));
  }
  memory::TensorInfo want;
  want.name = request.name();
  want.owner = caller.identity;
  want.readers = std::move(readers);
  want.writers = std::move(writers);
  want.layout = std::move(layout);
  want.home_gpu = gpu;
  want.lender = lender.known ? lender : owner_lender;
  want.memory_kind = first.kind_case() == v1::TensorMemory::kHost      ? "host"
                     : first.kind_case() == v1::TensorMemory::kCudaIpc ? "cuda_ipc"
                                                                       : "vmm";
  return parts_.registry->Register(std::move(want), std::move(imported),
                                   on_gpu ? static_cast<int>(gpu) : -1, std::move(owner));
}

grpc::ServerUnaryReactor* AgentService::UnregisterTensor(
    grpc::CallbackServerContext* context, const v1::UnregisterTensorRequest* request,
    v1::UnregisterTensorResponse*) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, Bit(Role::kEngine), "unregister tensors");
  if (!caller.ok()) return Answer(context, caller.status());
  // Letting go of the last hold of a tensor unmaps and deregisters its memory (an MR
  // per NIC, a CUDA import): on the same lanes as registering, off gRPC's threads.
  return AnswerOffThread(*parts_.registrations, RegistrationLane(*context, *caller),
                         [this, request, caller = *std::move(caller)]() -> absl::Status {
                           return parts_.registry->Unregister(
                               request->name(), [&](const memory::TensorInfo& info) {
                                 return parts_.guard->RequireOwner(caller, info.owner,
                                                                   info.name);
                               });
                         });
}

grpc::ServerUnaryReactor* AgentService::GetTensor(grpc::CallbackServerContext* context,
                                                  const v1::GetTensorRequest* request,
                                                  v1::Tensor* response) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, kSeeAll | Bit(Role::kEngine), "read tensors");
  if (!caller.ok()) return Answer(context, caller.status());
  absl::StatusOr<memory::TensorInfo> info = parts_.registry->Get(request->name());
  // An engine sees its own tensors only.
  if (info.ok() && !caller->Has(kSeeAll)) {
    if (absl::Status s = parts_.guard->RequireOwner(*caller, info->owner, info->name);
        !s.ok()) {
      return Answer(context, s);
    }
  }
  if (info.ok()) ToProto(*info, parts_.node, response);
  return Answer(context, info.status());
}

grpc::ServerUnaryReactor* AgentService::ListTensors(grpc::CallbackServerContext* context,
                                                    const v1::ListTensorsRequest* request,
                                                    v1::ListTensorsResponse* response) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, kSeeAll | Bit(Role::kEngine), "list tensors");
  if (!caller.ok()) return Answer(context, caller.status());
  constexpr uint32_t kDefaultPage = 100, kMaxPage = 1000;
  const uint32_t page =
      request->page_size() == 0 ? kDefaultPage : std::min(request->page_size(), kMaxPage);
  // The page token is the last name of the previous page. An engine sees its own
  // tensors only, and the registry walks no other's for it. The infos are copied
  // here, off the registry's lock.
  std::optional<absl::string_view> owner;
  if (!caller->Has(kSeeAll)) owner = caller->identity;
  bool more = false;
  const std::vector<std::shared_ptr<const memory::TensorInfo>> tensors =
      parts_.registry->List(request->page_token(), page, &more, owner);
  for (const auto& info : tensors) {
    ToProto(*info, parts_.node, response->add_tensors());
  }
  if (more && !tensors.empty()) response->set_next_page_token(tensors.back()->name);
  return Answer(context, absl::OkStatus());
}

}  // namespace fuselink::services
