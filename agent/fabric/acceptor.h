// Accepts the fabric's inbound connections on every NIC's listener, from one thread.
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/fabric/socket.h"

namespace fuselink::fabric {

// How long the acceptor waits before retrying after accept() ran out of resources
// (descriptors, memory), instead of spinning on a listener that stays readable.
inline constexpr int kAcceptRetryBackoffMs = 10;

class Acceptor {
 public:
  // Called on the acceptor thread with each accepted socket and the index of the
  // listener (the NIC) it came in on. Must not block for long.
  using OnAccept = std::function<void(int nic, UniqueFd socket)>;

  // Starts accepting on `listeners` (listener i is NIC i).
  static absl::StatusOr<std::unique_ptr<Acceptor>> Start(std::vector<UniqueFd> listeners,
                                                         OnAccept on_accept);
  // Stops the thread and closes the listeners. No OnAccept runs afterwards.
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

 private:
  Acceptor(std::vector<UniqueFd> listeners, UniqueFd wakeup, OnAccept on_accept);
  void Run();

  const std::vector<UniqueFd> listeners_;
  const UniqueFd wakeup_;  // an eventfd; readable once the destructor wants a stop
  const OnAccept on_accept_;
  std::thread thread_;
};

}  // namespace fuselink::fabric
