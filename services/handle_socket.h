// The agent's Unix socket for file descriptors: an engine sends a memfd (or a VMM
// export) with SCM_RIGHTS and gets back a token that RegisterTensor then names.
// gRPC cannot carry descriptors; this socket carries nothing else.
//
// Protocol, per message (handle_protocol.h has it as bytes): the client sends 1 byte
// ('F') with one descriptor attached; the agent answers 16 bytes: u32 code
// (absl::StatusCode, 0 = OK), u32 reserved, u64 token (little-endian). Connections
// may send many messages.
#pragma once

#include <atomic>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/memory/fd_tokens.h"

namespace fuselink::services {

class HandleSocket {
 public:
  // Listens at `path` (an existing socket file there is replaced).
  static absl::StatusOr<std::unique_ptr<HandleSocket>> Listen(std::string path,
                                                              memory::FdTokens* tokens);
  ~HandleSocket();
  const std::string& path() const { return path_; }

 private:
  HandleSocket(std::string path, UniqueFd fd, memory::FdTokens* tokens);
  void Serve();
  void ServeClient(int fd);

  const std::string path_;
  UniqueFd listen_fd_;
  memory::FdTokens* const tokens_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Client side: sends `fd` to the agent at `path`, returns the token.
absl::StatusOr<uint64_t> SendFd(const std::string& path, int fd);

}  // namespace fuselink::services
