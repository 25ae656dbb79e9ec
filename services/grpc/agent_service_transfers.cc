// The Agent service's transfer calls (the class: agent_service.h): TransferKVCache,
// streamed by a reactor the transfer drives (transfer_stream.h), or forwarded to the
// source node's agent; GetTransfer, CancelTransfer, ExtendLease and LayersReady, run
// here or forwarded the same way (transfer_control.h); and WatchTransfers, a stream
// fed by the node's WatchHub.
#include <string>
#include <utility>

#include "services/grpc/agent_service.h"
#include "services/grpc/agent_service_internal.h"
#include "services/grpc/answer_off_thread.h"
#include "services/grpc/transfer_control.h"
#include "services/grpc/transfer_stream.h"

namespace fuselink::services {
namespace {

using security::Bit;
using security::Role;

class WatchStream final : public grpc::ServerWriteReactor<v1::WatchEvent>,
                          public WatchSink {
 public:
  WatchStream(grpc::CallbackServerContext* context, WatchHub& hub, std::string identity,
              std::string tensor, bool outgoing, const absl::Status& allowed)
      : hub_(hub) {
    if (!allowed.ok()) {
      Finish(ToGrpcStatus(allowed));
      return;
    }
    // Past the identity's share: refused, and nothing was added.
    if (absl::Status added =
            hub_.Add(this, std::move(identity), std::move(tensor), outgoing, &watcher_);
        !added.ok()) {
      Finish(ToGrpcStatus(added));
      return;
    }
    // Said outright, so that a client never takes a refusal's empty metadata for it.
    context->AddInitialMetadata(std::string(kWatchReadyKey), "1");
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

}  // namespace

grpc::ServerWriteReactor<v1::TransferEvent>* AgentService::TransferKVCache(
    grpc::CallbackServerContext* context, const v1::TransferRequest* request) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, Bit(Role::kRouter), "move tensors");
  const std::string& source = request->source().node();
  if (source != parts_.node && parts_.peers->Knows(source)) {
    // The source is another node's (the target's agent asked, say): that agent moves
    // it, asked as this caller, and its events come back through here.
    absl::StatusOr<std::string> requester =
        caller.ok() ? absl::StatusOr<std::string>(caller->identity) : caller.status();
    return new ForwardStream(*parts_.peers, context, *request, parts_.node,
                             std::move(requester));
  }
  absl::StatusOr<transfer::Requester> requester =
      caller.ok() ? RequesterOf(parts_.guard, *caller) : caller.status();
  return new TransferStream(*parts_.engine, context, *request, std::move(requester));
}

grpc::ServerUnaryReactor* AgentService::Control(grpc::CallbackServerContext* context,
                                                v1::ForwardControlRequest call,
                                                v1::TransferStatus* response) {
  absl::StatusOr<security::Caller> caller =
      Authorize(context, Bit(Role::kRouter), ActionOf(call));
  if (!caller.ok()) return Answer(context, caller.status());
  const std::string& source = SourceOf(call, parts_.node);
  if (source == parts_.node) {
    return Answer(context, RunControl(*parts_.engine, call, *caller, response));
  }
  // Another node's transfer: its agent answers, asked as this caller.
  call.set_from_node(parts_.node);
  call.set_requester(caller->identity);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  parts_.peers->ForwardControl(
      source, call, CallDeadline(context), response,
      [reactor](const absl::Status& status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

grpc::ServerUnaryReactor* AgentService::GetTransfer(grpc::CallbackServerContext* context,
                                                    const v1::GetTransferRequest* request,
                                                    v1::TransferStatus* response) {
  return Control(context, ControlOf(*request), response);
}

grpc::ServerUnaryReactor* AgentService::CancelTransfer(
    grpc::CallbackServerContext* context, const v1::CancelTransferRequest* request,
    v1::TransferStatus* response) {
  return Control(context, ControlOf(*request), response);
}

grpc::ServerUnaryReactor* AgentService::ExtendLease(grpc::CallbackServerContext* context,
                                                    const v1::ExtendLeaseRequest* request,
                                                    v1::TransferStatus* response) {
  return Control(context, ControlOf(*request), response);
}

grpc::ServerUnaryReactor* AgentService::LayersReady(grpc::CallbackServerContext* context,
                                                    const v1::LayersReadyRequest* request,
                                                    v1::TransferStatus* response) {
  return Control(context, ControlOf(*request), response);
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
      allowed = parts_.guard->Require(*caller, Bit(Role::kRouter) | Bit(Role::kViewer),
                                      "watch every tensor");
    } else {
      absl::StatusOr<memory::TensorInfo> info = parts_.registry->Get(request->tensor());
      allowed = info.ok() ? parts_.guard->RequireOwner(*caller, info->owner, info->name)
                          : info.status();
    }
  }
  return new WatchStream(context, *parts_.watch_hub,
                         caller.ok() ? caller->identity : std::string(),
                         request->tensor(), request->outgoing(), allowed);
}

}  // namespace fuselink::services
