#include "services/grpc/transfer_stream.h"

#include "absl/time/clock.h"
#include "agent/common/grpc_status.h"
#include "services/grpc/request_checks.h"

namespace fuselink::services {

absl::Time CallDeadline(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline >=
      std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

absl::StatusOr<transfer::Requester> RequesterOf(security::Guard* guard,
                                                const security::Caller& caller) {
  if (absl::Status s =
          guard->Require(caller, security::Bit(security::Role::kRouter), "move tensors");
      !s.ok()) {
    return s;
  }
  return transfer::Requester{
      .identity = caller.identity,
      .may_read = [guard, who = caller](const memory::TensorInfo& tensor) {
        return guard->RequireGrant(who, tensor.owner, tensor.readers, "out of",
                                   tensor.name);
      }};
}

TransferStream::TransferStream(transfer::Engine& engine,
                               grpc::CallbackServerContext* context,
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

void TransferStream::End(const absl::Status& status) { Finish(ToGrpcStatus(status)); }

void TransferStream::OnCancel() {
  if (transfer_) transfer_->OnStreamCancelled(sub_);
}

void TransferStream::OnDone() {
  if (transfer_) transfer_->Unsubscribe(sub_);
  delete this;
}

ForwardStream::ForwardStream(peer::PeerDirectory& peers,
                             grpc::CallbackServerContext* context,
                             const v1::TransferRequest& request,
                             absl::string_view from_node,
                             absl::StatusOr<std::string> requester) {
  if (!requester.ok()) {
    Finish(ToGrpcStatus(requester.status()));
    return;
  }
  *forwarded_.mutable_request() = request;
  forwarded_.set_requester(*requester);
  forwarded_.set_from_node(std::string(from_node));
  const absl::Time deadline = CallDeadline(context);
  if (deadline != absl::InfiniteFuture()) {
    upstream_context_.set_deadline(absl::ToChronoTime(deadline));
  }
  const std::string& source = request.source().node();
  absl::StatusOr<std::shared_ptr<const void>> session =
      peers.StartForward(source, &upstream_context_, &forwarded_, &upstream_);
  if (!session.ok()) {
    Finish(ToGrpcStatus(session.status()));
    return;
  }
  session_ = *std::move(session);
  source_ = source;
  deadline_ = deadline;
  holds_.store(2);
  // Reads are started from the server's OnWriteDone, outside the client reactor's
  // own reactions: the hold keeps the forwarded call from finishing (and its reader
  // from going) while a server write is out. Let go once a read comes back empty,
  // or once the caller is gone.
  upstream_.AddHold();
  upstream_.StartRead(&event_);
  upstream_.StartCall();
}

void ForwardStream::OnUpstreamRead(bool ok) {
  if (!ok) {
    upstream_.RemoveHold();  // the status follows, in OnUpstreamDone
    return;
  }
  StartWrite(&event_);
}

void ForwardStream::OnWriteDone(bool ok) {
  if (ok) {
    upstream_.StartRead(&event_);
    return;
  }
  upstream_context_.TryCancel();  // the caller went away
  upstream_.RemoveHold();
}

void ForwardStream::OnUpstreamDone(const grpc::Status& status) {
  // No server write is out: the hold lasted until the last one was done. The
  // source's own errors keep their code and reason; a source that cannot be reached
  // is UNAVAILABLE (PEER_UNREACHABLE), its deadline DEADLINE_EXCEEDED.
  Finish(status.ok() ? status
                     : ToGrpcStatus(peer::PeerCallStatus(status, source_, deadline_)));
  Release();
}

void ForwardStream::OnCancel() {
  if (session_ != nullptr) upstream_context_.TryCancel();
}

void ForwardStream::OnDone() { Release(); }

void ForwardStream::Release() {
  if (holds_.fetch_sub(1) == 1) delete this;
}

}  // namespace fuselink::services
