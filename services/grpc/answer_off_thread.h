// Answering unary calls: Answer at once, for work that does not block; a handler
// whose work blocks (maps memory, registers it with a NIC, waits for a fabric's
// handshake) answers from a thread of a KeyedPool, never from gRPC's: gRPC's
// threads are few and shared by every call, health checks included, so one caller's
// slow work would hold up every other caller.
//
//   return AnswerOffThread(*parts_.registrations, caller.identity,
//                          [=] { return DoTheWork(*request, response); });
//
// The call is answered from the pool once `work` returns its status (having filled the
// response); a post the pool refuses (a lane or the pool at its bound:
// RESOURCE_EXHAUSTED with the pool's reason; shutting down: UNAVAILABLE) is answered
// at once, on this thread, with that. The request and response stay valid until the
// answer (gRPC's contract), so `work` may hold their pointers; whatever else it holds
// it must own.
//
// gRPC frees the request and response on its own thread once the call is done,
// ordered after the answer by its completion queue, which ThreadSanitizer cannot see
// (Debian's gRPC is not built with it): `work`'s reads of the request on the pool's
// thread then look unordered against the free. OffThreadReactor makes the order
// visible: the answering thread releases a mutex after `work`, and OnDone, which gRPC
// runs before it frees the messages, acquires it.
//
// Limit of use: the pool must run what it queued before it goes (Stop with
// run_queued), or a queued call is never answered and the server's shutdown waits for
// it.
#pragma once

#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "agent/common/grpc_status.h"
#include "agent/transfer/worker_pool.h"
#include "grpcpp/grpcpp.h"

namespace fuselink::services {

// A unary call answered at once, on this thread: for work that does not block.
inline grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                        const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A unary call's reactor answered from another thread (above). Deletes itself when
// the call is done.
class OffThreadReactor final : public grpc::ServerUnaryReactor {
 public:
  // Once: the answer. Nothing of this may be touched after.
  void Answer(const absl::Status& status) {
    { std::lock_guard<std::mutex> released(order_); }
    Finish(ToGrpcStatus(status));
  }
  void OnDone() override {
    { std::lock_guard<std::mutex> acquired(order_); }
    delete this;
  }

 private:
  std::mutex order_;  // orders the answering thread's work before gRPC's free
};

template <typename Work>
grpc::ServerUnaryReactor* AnswerOffThread(transfer::KeyedPool& pool,
                                          absl::string_view key, Work work) {
  auto* reactor = new OffThreadReactor();
  const absl::Status posted = pool.Post(key, [reactor, work = std::move(work)]() mutable {
    reactor->Answer(std::move(work)());
  });
  if (!posted.ok()) reactor->Answer(posted);
  return reactor;
}

}  // namespace fuselink::services
