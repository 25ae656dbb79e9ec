// The control API (fuselink.v1.Agent) on the gRPC callback API. Handlers validate,
// call into the node and answer; none blocks a gRPC thread: transfers are prepared on
// the engine's threads and streamed by reactors that the transfer drives, and
// RegisterTensor's mapping and registering runs on the node's registrations() pool, a
// lane per caller with bounds per caller and in all (RESOURCE_EXHAUSTED,
// REGISTRATIONS_BUSY past them). Every request's bytes
// are checked before it is parsed (checked_request.h): a string field that is not
// UTF-8 is INVALID_ARGUMENT (BAD_UTF8), bytes that are no message MALFORMED_REQUEST.
#pragma once

#include <string>

#include "agent/gpu/runtime.h"
#include "agent/memory/fd_tokens.h"
#include "agent/memory/registry.h"
#include "agent/node/ipc_imports.h"
#include "agent/node/watch_hub.h"
#include "agent/peer/peer_directory.h"
#include "agent/security/guard.h"
#include "agent/transfer/engine.h"
#include "agent/transfer/worker_pool.h"
#include "fuselink/v1/agent.grpc.pb.h"
#include "fuselink/v1/peer.pb.h"
#include "services/grpc/checked_request.h"

namespace fuselink::services {

// The initial-metadata key a WatchTransfers stream carries, set to "1", once the watch
// is in place (a refused watch sends none).
inline constexpr absl::string_view kWatchReadyKey = "fuselink-watch-ready";

// The parts of the node the Agent service calls into, and no others; each outlives
// the service (the composition root, services/main.cc, fills this from its Node).
struct AgentServiceParts {
  std::string node;                        // this node's name
  const v1::Topology* topology = nullptr;  // GetTopology's answer
  security::Guard* guard = nullptr;        // who may do what
  memory::Registry* registry = nullptr;    // the tensors
  memory::FdTokens* fd_tokens = nullptr;   // descriptors lent over the handle socket
  IpcImports* ipc_imports = nullptr;       // CUDA IPC handles opened here
  const gpu::Runtime* gpu = nullptr;       // null without GPUs; then gpu_status says why
  std::string gpu_status;
  transfer::Engine* engine = nullptr;            // this node's transfers as a source
  peer::PeerDirectory* peers = nullptr;          // other nodes' agents (forwarded calls)
  WatchHub* watch_hub = nullptr;                 // WatchTransfers
  transfer::KeyedPool* registrations = nullptr;  // RegisterTensor's blocking work
};

class AgentService final : public CheckedService<v1::Agent> {
 public:
  explicit AgentService(AgentServiceParts parts);

  grpc::ServerUnaryReactor* RegisterTensor(grpc::CallbackServerContext* context,
                                           const v1::RegisterTensorRequest* request,
                                           v1::Tensor* response) override;
  grpc::ServerUnaryReactor* UnregisterTensor(
      grpc::CallbackServerContext* context, const v1::UnregisterTensorRequest* request,
      v1::UnregisterTensorResponse* response) override;
  grpc::ServerUnaryReactor* GetTensor(grpc::CallbackServerContext* context,
                                      const v1::GetTensorRequest* request,
                                      v1::Tensor* response) override;
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext* context,
                                        const v1::ListTensorsRequest* request,
                                        v1::ListTensorsResponse* response) override;
  grpc::ServerWriteReactor<v1::TransferEvent>* TransferKVCache(
      grpc::CallbackServerContext* context, const v1::TransferRequest* request) override;
  grpc::ServerUnaryReactor* GetTransfer(grpc::CallbackServerContext* context,
                                        const v1::GetTransferRequest* request,
                                        v1::TransferStatus* response) override;
  grpc::ServerUnaryReactor* LayersReady(grpc::CallbackServerContext* context,
                                        const v1::LayersReadyRequest* request,
                                        v1::TransferStatus* response) override;
  grpc::ServerUnaryReactor* ExtendLease(grpc::CallbackServerContext* context,
                                        const v1::ExtendLeaseRequest* request,
                                        v1::TransferStatus* response) override;
  grpc::ServerUnaryReactor* CancelTransfer(grpc::CallbackServerContext* context,
                                           const v1::CancelTransferRequest* request,
                                           v1::TransferStatus* response) override;
  grpc::ServerWriteReactor<v1::WatchEvent>* WatchTransfers(
      grpc::CallbackServerContext* context,
      const v1::WatchTransfersRequest* request) override;
  grpc::ServerUnaryReactor* GetTopology(grpc::CallbackServerContext* context,
                                        const v1::GetTopologyRequest* request,
                                        v1::Topology* response) override;

 private:
  // The caller, if it holds one of `any_of`.
  absl::StatusOr<security::Caller> Authorize(grpc::CallbackServerContext* context,
                                             security::Roles any_of,
                                             absl::string_view action);
  // Maps or imports one region of a tensor's memory; `*lender`, when still unknown,
  // becomes whoever passed its descriptor. A CUDA IPC import is `owner`'s alone.
  absl::StatusOr<memory::RegionMemory> Import(const v1::TensorMemory& memory,
                                              const ImportOwner& owner,
                                              memory::Lender* lender);
  // A router's call on one of its own transfers (transfer_control.h): run here, or
  // forwarded to the agent of the source node it names.
  grpc::ServerUnaryReactor* Control(grpc::CallbackServerContext* context,
                                    v1::ForwardControlRequest call,
                                    v1::TransferStatus* response);
  // Checks the request, imports or maps the memory, registers it as the caller's.
  absl::StatusOr<memory::TensorInfo> Register(const v1::RegisterTensorRequest& request,
                                              const security::Caller& caller);

  const AgentServiceParts parts_;
};

}  // namespace fuselink::services
