#include "services/agent_service.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"
#include "agent/gpu/ipc.h"
#include "agent/gpu/vmm.h"
#include "services/request_checks.h"

namespace fuselink::services {
namespace {

// Who may move a tensor when its owner names nobody: the cluster's routers.
constexpr absl::string_view kDefaultGrant = "role:router";
// Roles that see every tensor.
constexpr security::Roles kSeeAll =
    security::Bit(security::Role::kRouter) | security::Bit(security::Role::kViewer);

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

void ToProto(const memory::TensorInfo& info, absl::string_view node, v1::Tensor* out) {
  out->set_name(info.name);
  v1::Layout* l = out->mutable_layout();
  l->set_layers(info.layout.layers);
  l->set_blocks_per_layer(info.layout.blocks_per_layer);
  l->set_block_bytes(info.layout.block_bytes);
  l->set_block_stride_bytes(info.layout.block_stride_bytes);
  l->set_layer_stride_bytes(info.layout.layer_stride_bytes);
  out->set_memory_kind(info.memory_kind);
  out->set_size_bytes(info.size_bytes);
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

using security::Bit;
using security::Role;

absl::Time CallDeadline(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline >=
      std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

// Follows one transfer and writes its events to the caller.
class TransferStream final : public grpc::ServerWriteReactor<v1::TransferEvent>,
                             public transfer::EventSink {
 public:
  TransferStream(transfer::Engine& engine, grpc::CallbackServerContext* context,
                 const v1::TransferRequest& request,
                 absl::StatusOr<transfer::Requester> requester) {
    if (!requester.ok()) {
      Finish(ToGrpcStatus(requester.status()));
      return;
    }
    // A deadline that has passed, or is no Timestamp, is refused before the engine
    // reserves anything for it.
    if (absl::Status checked = CheckDeadline(request, absl::Now()); !checked.ok()) {
      Finish(ToGrpcStatus(checked));
      return;
    }
    absl::StatusOr<std::shared_ptr<transfer::Transfer>> t =
        engine.Submit(request, CallDeadline(context), *requester);
    if (!t.ok()) {
      Finish(ToGrpcStatus(t.status()));
      return;
    }
    transfer_ = std::move(*t);
    transfer_->Subscribe(this, &sub_);
  }
  void SendEvent(const v1::TransferEvent* event) override { StartWrite(event); }
  void End(const absl::Status& status) override { Finish(ToGrpcStatus(status)); }
  void OnWriteDone(bool ok) override { transfer_->OnWriteDone(sub_, ok); }
  void OnCancel() override {
    if (transfer_) transfer_->OnStreamCancelled(sub_);
  }
  void OnDone() override {
    if (transfer_) transfer_->Unsubscribe(sub_);
    delete this;
  }

 private:
  std::shared_ptr<transfer::Transfer> transfer_;
  transfer::Transfer::Subscription* sub_ = nullptr;
};

class WatchStream final : public grpc::ServerWriteReactor<v1::WatchEvent>,
                          public WatchSink {
 public:
  WatchStream(WatchHub& hub, std::string tensor, const absl::Status& allowed)
      : hub_(hub) {
    if (!allowed.ok()) {
      Finish(ToGrpcStatus(allowed));
      return;
    }
    hub_.Add(this, std::move(tensor), &watcher_);
    // Tells the client the watch is in place: every transfer that finishes from now
    // on reaches it. Without this a client cannot know when it may start the
    // transfers it watches for. gRPC holds operations started in the constructor
    // until the reactor is bound, and sends initial metadata before any write.
    StartSendInitialMetadata();
  }
  void SendEvent(const v1::WatchEvent* event) override { StartWrite(event); }
  void End(const absl::Status& status) override { Finish(ToGrpcStatus(status)); }
  void OnWriteDone(bool ok) override { hub_.OnWriteDone(watcher_, ok); }
  void OnCancel() override {
    if (watcher_ != nullptr) hub_.OnCancel(watcher_);
  }
  void OnDone() override {
    if (watcher_ != nullptr) hub_.Remove(watcher_);
    delete this;
  }

 private:
  WatchHub& hub_;
  WatchHub::Watcher* watcher_ = nullptr;
};

// The caller's own transfers only: another router's are NOT_FOUND, as if none.
absl::StatusOr<std::shared_ptr<transfer::Transfer>> FindTransfer(
    transfer::Engine& engine, const std::string& transfer_id,
    const std::string& request_id, const security::Caller& caller) {
  if (transfer_id.empty() && request_id.empty()) {
    return WithReason(absl::InvalidArgumentError("give transfer_id or request_id"),
                      "MISSING_ID");
  }
  return engine.Find(transfer_id, request_id, caller.identity);
}

// A handle the driver refused: INVALID_ARGUMENT (BAD_GPU_HANDLE) with the driver's
// words; out of memory and a dead context keep their own codes.
absl::Status HandleRefused(const absl::Status& status) {
  if (!absl::IsInvalidArgument(status)) return status;
  return WithReason(absl::InvalidArgumentError(status.message()), "BAD_GPU_HANDLE");
}

}  // namespace

AgentService::AgentService(Node* node) : node_(node) {
  Check("RegisterTensor", &AgentService::RegisterTensor);
  Check("UnregisterTensor", &AgentService::UnregisterTensor);
  Check("GetTensor", &AgentService::GetTensor);
  Check("ListTensors", &AgentService::ListTensors);
  Check("TransferKVCache", &AgentService::TransferKVCache);
  Check("GetTransfer", &AgentService::GetTransfer);
  Check("CancelTransfer", &AgentService::CancelTransfer);
  Check("WatchTransfers", &AgentService::WatchTransfers);
  Check("GetTopology", &AgentService::GetTopology);
}

absl::StatusOr<security::Caller> AgentService::Authorize(
    grpc::CallbackServerContext* context, security::Roles any_of,
    absl::string_view action) {
  security::Guard& guard = node_->guard();
  FL_ASSIGN_OR_RETURN(security::Caller caller,
                      guard.Identify(context->auth_context().get()));
  FL_RETURN_IF_ERROR(guard.Require(caller, any_of, action));
  return caller;
}

grpc::ServerUnaryReactor* AgentService::RegisterTensor(
    grpc::CallbackServerContext* context, const v1::RegisterTensorRequest* request,
    v1::Tensor* response) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, Bit(Role::kEngine), "register tensors");
  if (!caller.ok()) return Answer(context, caller.status());
  absl::StatusOr<memory::TensorInfo> info = Register(*request, *caller);
  if (info.ok()) ToProto(*info, node_->name(), response);
  return Answer(context, info.status());
}

absl::StatusOr<memory::TensorInfo> AgentService::Register(
    const v1::RegisterTensorRequest& request, const security::Caller& caller) {
  const v1::TensorMemory& memory = request.memory();
  if (memory.kind_case() == v1::TensorMemory::KIND_NOT_SET) {
    return WithReason(absl::InvalidArgumentError("memory is required"), "BAD_MEMORY");
  }
  const bool on_gpu = memory.kind_case() != v1::TensorMemory::kHost;
  const uint32_t gpu =
      memory.kind_case() == v1::TensorMemory::kCudaIpc ? memory.cuda_ipc().gpu()
      : memory.kind_case() == v1::TensorMemory::kVmm   ? memory.vmm().gpu()
                                                       : request.home_gpu();
  if (gpu >= static_cast<uint32_t>(node_->topology().gpus_size())) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(on_gpu ? "gpu " : "home_gpu ", gpu,
                                                " does not exist on this node")),
        "BAD_HOME_GPU");
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
  if (memory.kind_case() == v1::TensorMemory::kCudaIpc &&
      memory.cuda_ipc().handle().size() != sizeof(gpu::IpcMemHandle)) {
    return WithReason(absl::InvalidArgumentError(absl::StrCat(
                          "cuda_ipc.handle has ", memory.cuda_ipc().handle().size(),
                          " bytes; a CUDA IPC handle has ", sizeof(gpu::IpcMemHandle))),
                      "BAD_GPU_HANDLE");
  }
  const uint64_t gpu_bytes = memory.kind_case() == v1::TensorMemory::kCudaIpc
                                 ? memory.cuda_ipc().size_bytes()
                                 : memory.vmm().size_bytes();
  if (on_gpu && gpu_bytes == 0) {
    return WithReason(absl::InvalidArgumentError("GPU memory needs size_bytes"),
                      "BAD_MEMORY");
  }
  const gpu::Runtime* runtime = node_->gpu();
  if (on_gpu && (runtime == nullptr || !runtime->has(static_cast<int>(gpu)))) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          "GPU ", gpu, " is not a CUDA device of this agent (",
                          node_->gpu_status(), ")")),
                      "NO_GPU");
  }
  // The lender is who passed the memory's descriptor, else who passed the owner's
  // pidfd: the kernel's word for both (memory::Lender), not the request's.
  UniqueFd owner;
  memory::Lender lender;
  if (request.owner_fd_token() != 0) {
    FL_ASSIGN_OR_RETURN(memory::LentFd lent,
                        node_->fd_tokens().Take(request.owner_fd_token()));
    owner = std::move(lent.fd);
    lender = lent.lender;
  }
  memory::TensorInfo want;
  want.name = request.name();
  want.owner = caller.identity;
  want.readers = std::move(readers);
  want.writers = std::move(writers);
  const v1::Layout& l = request.layout();
  want.layout = memory::Layout{l.layers(), l.blocks_per_layer(), l.block_bytes(),
                               l.block_stride_bytes(), l.layer_stride_bytes()};
  want.home_gpu = gpu;
  want.lender = lender;
  memory::Registry& registry = node_->registry();
  switch (memory.kind_case()) {
    case v1::TensorMemory::kHost: {
      FL_ASSIGN_OR_RETURN(memory::LentFd lent,
                          node_->fd_tokens().Take(memory.host().fd_token()));
      want.lender = lent.lender;
      return registry.RegisterHost(std::move(want), std::move(lent.fd),
                                   memory.host().offset_bytes(),
                                   memory.host().size_bytes(), std::move(owner));
    }
    case v1::TensorMemory::kCudaIpc: {
      const v1::CudaIpcMemory& ipc = memory.cuda_ipc();
      gpu::IpcMemHandle handle;
      std::memcpy(handle.data(), ipc.handle().data(), handle.size());
      absl::StatusOr<gpu::IpcImport> import =
          gpu::IpcImport::Open(runtime->context(static_cast<int>(gpu)), handle,
                               ipc.offset_bytes(), ipc.size_bytes());
      if (!import.ok()) return HandleRefused(import.status());
      auto held = std::make_shared<gpu::IpcImport>(std::move(*import));
      want.memory_kind = "cuda_ipc";
      return registry.RegisterGpu(std::move(want), held->ptr(), static_cast<int>(gpu),
                                  ipc.size_bytes(), held, std::move(owner));
    }
    case v1::TensorMemory::kVmm: {
      const v1::VmmMemory& vmm = memory.vmm();
      FL_ASSIGN_OR_RETURN(memory::LentFd lent, node_->fd_tokens().Take(vmm.fd_token()));
      want.lender = lent.lender;
      const UniqueFd fd = std::move(lent.fd);
      const gpu::PrimaryContext& ctx = runtime->context(static_cast<int>(gpu));
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
      want.memory_kind = "vmm";
      return registry.RegisterGpu(std::move(want), held->ptr() + vmm.offset_bytes(),
                                  static_cast<int>(gpu), vmm.size_bytes(), held,
                                  std::move(owner));
    }
    default:
      return WithReason(absl::InvalidArgumentError("unknown memory kind"), "BAD_MEMORY");
  }
}

grpc::ServerUnaryReactor* AgentService::UnregisterTensor(
    grpc::CallbackServerContext* context, const v1::UnregisterTensorRequest* request,
    v1::UnregisterTensorResponse*) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, Bit(Role::kEngine), "unregister tensors");
  if (!caller.ok()) return Answer(context, caller.status());
  return Answer(
      context,
      node_->registry().Unregister(request->name(), [&](const memory::TensorInfo& info) {
        return node_->guard().RequireOwner(*caller, info.owner, info.name);
      }));
}

grpc::ServerUnaryReactor* AgentService::GetTensor(grpc::CallbackServerContext* context,
                                                  const v1::GetTensorRequest* request,
                                                  v1::Tensor* response) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, kSeeAll | Bit(Role::kEngine), "read tensors");
  if (!caller.ok()) return Answer(context, caller.status());
  absl::StatusOr<memory::TensorInfo> info = node_->registry().Get(request->name());
  // An engine sees its own tensors only.
  if (info.ok() && !caller->Has(kSeeAll)) {
    if (absl::Status s = node_->guard().RequireOwner(*caller, info->owner, info->name);
        !s.ok()) {
      return Answer(context, s);
    }
  }
  if (info.ok()) ToProto(*info, node_->name(), response);
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
  // tensors only: the registry is read on past others' (whose names its tokens never
  // carry) until the page is full or nothing follows.
  const bool all = caller->Has(kSeeAll);
  std::string after = request->page_token();
  bool more = true;
  while (more && static_cast<uint32_t>(response->tensors_size()) < page) {
    std::vector<memory::TensorInfo> tensors = node_->registry().List(after, page, &more);
    if (tensors.empty()) break;
    after = tensors.back().name;
    for (const auto& info : tensors) {
      if (static_cast<uint32_t>(response->tensors_size()) == page) {
        more = true;
        break;
      }
      if (all || info.owner == caller->identity) {
        ToProto(info, node_->name(), response->add_tensors());
      }
    }
  }
  if (more && response->tensors_size() > 0) {
    response->set_next_page_token(response->tensors(response->tensors_size() - 1).name());
  }
  return Answer(context, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::TransferEvent>* AgentService::TransferKVCache(
    grpc::CallbackServerContext* context, const v1::TransferRequest* request) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, Bit(Role::kRouter), "move tensors");
  absl::StatusOr<transfer::Requester> requester = absl::UnknownError("unset");
  if (!caller.ok()) {
    requester = caller.status();
  } else {
    security::Guard* guard = &node_->guard();
    requester = transfer::Requester{
        .identity = caller->identity,
        .may_read = [guard, who = *caller](const memory::TensorInfo& tensor) {
          return guard->RequireGrant(who, tensor.owner, tensor.readers, "out of",
                                     tensor.name);
        }};
  }
  return new TransferStream(node_->engine(), context, *request, std::move(requester));
}

grpc::ServerUnaryReactor* AgentService::GetTransfer(grpc::CallbackServerContext* context,
                                                    const v1::GetTransferRequest* request,
                                                    v1::TransferStatus* response) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, Bit(Role::kRouter), "follow transfers");
  if (!caller.ok()) return Answer(context, caller.status());
  auto t = FindTransfer(node_->engine(), request->transfer_id(), request->request_id(),
                        *caller);
  if (t.ok()) *response = (*t)->Status();
  return Answer(context, t.status());
}

grpc::ServerUnaryReactor* AgentService::CancelTransfer(
    grpc::CallbackServerContext* context, const v1::CancelTransferRequest* request,
    v1::TransferStatus* response) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, Bit(Role::kRouter), "cancel transfers");
  if (!caller.ok()) return Answer(context, caller.status());
  auto t = FindTransfer(node_->engine(), request->transfer_id(), request->request_id(),
                        *caller);
  if (!t.ok()) return Answer(context, t.status());
  absl::Status s = node_->engine().Cancel(*t);
  *response = (*t)->Status();
  return Answer(context, s);
}

grpc::ServerWriteReactor<v1::WatchEvent>* AgentService::WatchTransfers(
    grpc::CallbackServerContext* context, const v1::WatchTransfersRequest* request) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, Bit(Role::kRouter) | Bit(Role::kViewer) | Bit(Role::kEngine),
                "watch transfers");
  absl::Status allowed = caller.status();
  // An engine watches its own tensors only, one at a time.
  if (caller.ok() && !caller->Has(Bit(Role::kRouter) | Bit(Role::kViewer))) {
    if (request->tensor().empty()) {
      allowed = node_->guard().Require(*caller, Bit(Role::kRouter) | Bit(Role::kViewer),
                                       "watch every tensor");
    } else {
      absl::StatusOr<memory::TensorInfo> info = node_->registry().Get(request->tensor());
      allowed = info.ok() ? node_->guard().RequireOwner(*caller, info->owner, info->name)
                          : info.status();
    }
  }
  return new WatchStream(node_->watch_hub(), request->tensor(), allowed);
}

grpc::ServerUnaryReactor* AgentService::GetTopology(grpc::CallbackServerContext* context,
                                                    const v1::GetTopologyRequest*,
                                                    v1::Topology* response) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, kSeeAll | Bit(Role::kEngine), "read the topology");
  if (!caller.ok()) return Answer(context, caller.status());
  *response = node_->topology();
  return Answer(context, absl::OkStatus());
}

}  // namespace fuselink::services
