// Client helpers for engines, tools and tests: host tensors in memfds, their
// registration with an agent, and a transfer run to its end.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "fuselink/v1/agent.grpc.pb.h"

namespace fuselink::client {

// A memfd of `bytes`, mapped shared in this process.
class HostBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<HostBuffer>> Create(const std::string& name,
                                                            uint64_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  int fd() const { return fd_.get(); }
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  std::span<uint8_t> span() const { return {data_, bytes_}; }

 private:
  HostBuffer(UniqueFd fd, uint8_t* data, uint64_t bytes)
      : fd_(std::move(fd)), data_(data), bytes_(bytes) {}
  UniqueFd fd_;
  uint8_t* data_;
  uint64_t bytes_;
};

// Deterministic bytes: the same (seed, offset) always gives the same byte.
void FillPattern(std::span<uint8_t> bytes, uint64_t seed);

// Passes the buffer's memfd over the agent's handle socket and registers it; with
// `owner_pidfd` (a pidfd), the agent drops the tensor when that process exits.
absl::StatusOr<v1::Tensor> RegisterHostTensor(
    v1::Agent::Stub& agent, const std::string& handle_socket, const std::string& name,
    const v1::Layout& layout, const HostBuffer& buffer, uint32_t home_gpu = 0,
    int owner_pidfd = -1);

struct TransferOutcome {
  absl::Status status;     // the call's final status
  v1::TransferEvent last;  // the last event seen (completed or failed when it ended)
  uint64_t events = 0;
};

// Runs TransferKVCache to its end, handing every event to `on_event` (may be empty).
TransferOutcome RunTransfer(v1::Agent::Stub& agent, const v1::TransferRequest& request,
                            const std::function<void(const v1::TransferEvent&)>& on_event,
                            absl::Duration timeout = absl::Minutes(10));

// Forgets a tensor on the agent (10 s deadline).
absl::Status UnregisterTensor(v1::Agent::Stub& agent, const std::string& name);

// A string value of the agent's one-line ready file (--ready_file,
// services/ready_file.h): "key":"value", its JSON escapes undone. Empty when the key
// is absent or its value is not a whole JSON string.
std::string ReadyField(const std::string& json, const std::string& key);

// The reason in a gRPC error's google.rpc.ErrorInfo, or empty.
std::string ReasonOf(const grpc::Status& status);

}  // namespace fuselink::client
