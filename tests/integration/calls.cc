#include "tests/integration/calls.h"

#include "absl/time/clock.h"

namespace fuselink::testing {

TransferCall::TransferCall(v1::Agent::Stub& stub, const v1::TransferRequest& request,
                           absl::Duration timeout) {
  context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  thread_ =
      std::thread(&TransferCall::Read, this, stub.TransferKVCache(&context_, request));
}

TransferCall::~TransferCall() {
  context_.TryCancel();
  if (thread_.joinable()) thread_.join();
}

void TransferCall::Read(std::unique_ptr<grpc::ClientReader<v1::TransferEvent>> reader) {
  v1::TransferEvent event;
  while (reader->Read(&event)) {
    absl::MutexLock lock(&mu_);
    result_.events.push_back(event);
  }
  grpc::Status status = reader->Finish();
  absl::MutexLock lock(&mu_);
  result_.status = std::move(status);
  result_.ended = absl::Now();
  done_ = true;
}

bool TransferCall::WaitForEvent(
    const std::function<bool(const v1::TransferEvent&)>& match, absl::Duration timeout) {
  size_t seen = 0;  // events already checked
  bool found = false;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (; !found && seen < result_.events.size(); ++seen) {
      found = match(result_.events[seen]);
    }
    return found || done_;
  };
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  return found;
}

bool TransferCall::WaitUntilMoving(absl::Duration timeout) {
  return WaitForEvent(
      [](const v1::TransferEvent& e) {
        return e.has_progress() && e.progress().bytes_done() > 0 &&
               e.progress().bytes_done() < e.progress().total_bytes();
      },
      timeout);
}

TransferResult TransferCall::Finish() {
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  return result_;
}

TransferResult RunTransfer(v1::Agent::Stub& stub, const v1::TransferRequest& request,
                           absl::Duration timeout) {
  TransferCall call(stub, request, timeout);
  return call.Finish();
}

grpc::Status LayersReady(v1::Agent::Stub& stub, const std::string& request_id,
                         uint32_t ready_end) {
  v1::LayersReadyRequest request;
  request.set_request_id(request_id);
  request.set_ready_end(ready_end);
  v1::TransferStatus ignored;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  return stub.LayersReady(&context, request, &ignored);
}

WatchCall::WatchCall(v1::Agent::Stub& stub, const std::string& tensor, bool outgoing,
                     absl::Duration timeout) {
  context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::WatchTransfersRequest request;
  request.set_tensor(tensor);
  request.set_outgoing(outgoing);
  thread_ = std::thread([this, &stub, request] {
    std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader =
        stub.WatchTransfers(&context_, request);
    reader->WaitForInitialMetadata();
    {
      // The agent says when the watch is in place; a refusal carries no such key.
      absl::MutexLock lock(&mu_);
      established_ =
          context_.GetServerInitialMetadata().count("fuselink-watch-ready") > 0;
    }
    v1::WatchEvent event;
    while (reader->Read(&event)) {
      absl::MutexLock lock(&mu_);
      events_.push_back(event);
    }
    grpc::Status status = reader->Finish();
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    ended_ = true;
  });
  absl::MutexLock lock(&mu_);
  auto ready = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return established_ || ended_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), kWaitTimeout);
}

WatchCall::~WatchCall() {
  context_.TryCancel();
  thread_.join();
}

bool WatchCall::established() const {
  absl::MutexLock lock(&mu_);
  return established_ && !ended_;
}

bool WatchCall::WaitForEvents(size_t count, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return events_.size() >= count || ended_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  return events_.size() >= count;
}

grpc::Status WatchCall::WaitForEnd(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ended), timeout)) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the watch did not end");
  }
  return status_;
}

std::vector<v1::WatchEvent> WatchCall::events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

}  // namespace fuselink::testing
