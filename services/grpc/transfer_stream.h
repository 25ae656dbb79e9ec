// The server streams of TransferKVCache (fuselink.v1.Agent) and of Peer.ForwardTransfer:
// a transfer this agent sends, followed and written to the caller (TransferStream), or
// one whose source is another node's agent, asked of that agent as the caller and
// relayed back event by event (ForwardStream).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/peer/peer_directory.h"
#include "agent/security/guard.h"
#include "agent/transfer/engine.h"
#include "fuselink/v1/agent.grpc.pb.h"
#include "fuselink/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace fuselink::services {

// The call's deadline; InfiniteFuture for none.
absl::Time CallDeadline(const grpc::CallbackServerContext* context);

// Who asks for a transfer as `caller`: a router (else PERMISSION_DENIED), reading only
// tensors it may read.
absl::StatusOr<transfer::Requester> RequesterOf(security::Guard* guard,
                                                const security::Caller& caller);

// Follows one transfer and writes its events to the caller.
class TransferStream final : public grpc::ServerWriteReactor<v1::TransferEvent>,
                             public transfer::EventSink {
 public:
  TransferStream(transfer::Engine& engine, grpc::CallbackServerContext* context,
                 const v1::TransferRequest& request,
                 absl::StatusOr<transfer::Requester> requester);
  void SendEvent(const v1::TransferEvent* event) override { StartWrite(event); }
  void End(const absl::Status& status) override;
  void OnWriteDone(bool ok) override { transfer_->OnWriteDone(sub_, ok); }
  void OnCancel() override;
  void OnDone() override;

 private:
  std::shared_ptr<transfer::Transfer> transfer_;
  transfer::Transfer::Subscription* sub_ = nullptr;
};

// A TransferKVCache whose source is node `request.source().node()`: asked of that
// node's agent (Peer.ForwardTransfer, over the authenticated peer channel, as
// `requester`), its events and final status relayed unchanged. Back-pressure holds
// end to end: the next event is read from the source only once the caller took the
// last one. The caller cancelling (or its deadline) cancels the forwarded call; the
// transfer itself goes on at the source, as a TransferKVCache stream's does.
class ForwardStream final : public grpc::ServerWriteReactor<v1::TransferEvent> {
 public:
  // `peers` outlives the stream.
  ForwardStream(peer::PeerDirectory& peers, grpc::CallbackServerContext* context,
                const v1::TransferRequest& request, absl::string_view from_node,
                absl::StatusOr<std::string> requester);
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  class Upstream final : public grpc::ClientReadReactor<v1::TransferEvent> {
   public:
    explicit Upstream(ForwardStream* stream) : stream_(stream) {}
    void OnReadDone(bool ok) override { stream_->OnUpstreamRead(ok); }
    void OnDone(const grpc::Status& status) override { stream_->OnUpstreamDone(status); }

   private:
    ForwardStream* const stream_;
  };
  void OnUpstreamRead(bool ok);
  void OnUpstreamDone(const grpc::Status& status);
  // Deletes the stream once both the caller's call and the forwarded one are done.
  void Release();

  v1::ForwardTransferRequest forwarded_;
  grpc::ClientContext upstream_context_;
  Upstream upstream_{this};
  std::shared_ptr<const void> session_;  // keeps the stub of the forwarded call
  std::string source_;
  absl::Time deadline_ = absl::InfiniteFuture();
  v1::TransferEvent event_;    // read from the source, then written here
  std::atomic<int> holds_{1};  // the caller's call, and the forwarded one once started
};

}  // namespace fuselink::services
