// Streaming calls read on a thread of their own, so that a test can act while a
// transfer runs or a watch waits: wait for an event, kill an agent, then collect the
// end of the stream.
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fuselink/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/agent_process.h"

namespace fuselink::testing {

// Bounds every call a test makes; a call that hits it has failed the test.
inline constexpr absl::Duration kCallTimeout = absl::Seconds(60);

struct TransferResult {
  grpc::Status status;
  std::vector<v1::TransferEvent> events;
  absl::Time ended;  // when the stream's status arrived
};

// One TransferKVCache call. Thread-safe.
class TransferCall {
 public:
  TransferCall(v1::Agent::Stub& stub, const v1::TransferRequest& request,
               absl::Duration timeout = kCallTimeout);
  // Cancels the call if it still runs, and waits for its thread.
  ~TransferCall();
  TransferCall(const TransferCall&) = delete;
  TransferCall& operator=(const TransferCall&) = delete;

  // Waits up to `timeout` for an event that `match` accepts. False if the stream ended
  // or the time ran out first.
  bool WaitForEvent(const std::function<bool(const v1::TransferEvent&)>& match,
                    absl::Duration timeout = kWaitTimeout);
  // Waits for the first progress event with bytes moved: the transfer is in flight.
  bool WaitUntilMoving(absl::Duration timeout = kWaitTimeout);
  // Waits for the end of the stream; the call's own deadline bounds the wait.
  TransferResult Finish();

 private:
  void Read(std::unique_ptr<grpc::ClientReader<v1::TransferEvent>> reader);

  grpc::ClientContext context_;
  mutable absl::Mutex mu_;
  TransferResult result_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Runs a transfer to its end.
TransferResult RunTransfer(v1::Agent::Stub& stub, const v1::TransferRequest& request,
                           absl::Duration timeout = kCallTimeout);

// Tells the agent that layers [0, ready_end) of its layer-by-layer transfer
// `request_id` exist (Agent.LayersReady).
grpc::Status LayersReady(v1::Agent::Stub& stub, const std::string& request_id,
                         uint32_t ready_end);

// One WatchTransfers call. The constructor returns once the agent has the watch in
// place (its initial metadata arrived), so every transfer that finishes afterwards
// reaches it. Thread-safe.
class WatchCall {
 public:
  // `outgoing`: the transfers the agent sends, not those landing there. `timeout`
  // bounds the whole stream (its gRPC deadline).
  WatchCall(v1::Agent::Stub& stub, const std::string& tensor, bool outgoing = false,
            absl::Duration timeout = kCallTimeout);
  ~WatchCall();
  WatchCall(const WatchCall&) = delete;
  WatchCall& operator=(const WatchCall&) = delete;

  // False if the agent did not confirm the watch within kWaitTimeout.
  bool established() const;
  // Waits up to `timeout` for at least `count` events.
  bool WaitForEvents(size_t count, absl::Duration timeout = kWaitTimeout);
  std::vector<v1::WatchEvent> events() const;
  // Waits up to `timeout` for the stream to end (a refused watch ends at once) and
  // returns its status; DEADLINE_EXCEEDED, here, when it did not end in time.
  grpc::Status WaitForEnd(absl::Duration timeout = kWaitTimeout);

 private:
  grpc::ClientContext context_;
  mutable absl::Mutex mu_;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  bool established_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<v1::WatchEvent> events_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace fuselink::testing
