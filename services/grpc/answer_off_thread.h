// A unary handler whose work blocks (maps memory, registers it with a NIC, waits for a
// fabric's handshake) answers from a thread of a KeyedPool, never from gRPC's: gRPC's
// threads are few and shared by every call, health checks included, so one caller's
// slow work would hold up every other caller.
//
//   return AnswerOffThread(context, node_->registrations(), caller.identity,
//                          [=] { return DoTheWork(*request, response); });
//
// The call is answered from the pool once `work` returns its status (having filled the
// response); a post the pool refuses (a lane or the pool at its bound:
// RESOURCE_EXHAUSTED with the pool's reason; shutting down: UNAVAILABLE) is answered
// at once, on this thread, with that. The request and response stay valid until the
// answer (gRPC's contract), so `work` may hold their pointers; whatever else it holds
// it must own.
//
// Limit of use: the pool must run what it queued before it goes (Stop with
// run_queued), or a queued call is never answered and the server's shutdown waits for
// it.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "agent/common/grpc_status.h"
#include "agent/transfer/worker_pool.h"
#include "grpcpp/grpcpp.h"

namespace fuselink::services {

template <typename Work>
grpc::ServerUnaryReactor* AnswerOffThread(grpc::CallbackServerContext* context,
                                          transfer::KeyedPool& pool,
                                          absl::string_view key, Work work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status posted = pool.Post(key, [reactor, work = std::move(work)]() mutable {
    const absl::Status status = std::move(work)();
    reactor->Finish(ToGrpcStatus(status));
  });
  if (!posted.ok()) reactor->Finish(ToGrpcStatus(posted));
  return reactor;
}

}  // namespace fuselink::services
