#include "agent/fabric/acceptor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "agent/common/check.h"
#include "agent/common/status_macros.h"

namespace fuselink::fabric {

absl::StatusOr<std::unique_ptr<Acceptor>> Acceptor::Start(std::vector<UniqueFd> listeners,
                                                          OnAccept on_accept) {
  UniqueFd wakeup(eventfd(0, EFD_CLOEXEC));
  if (!wakeup.valid()) return ErrnoStatus("eventfd", errno);
  return std::unique_ptr<Acceptor>(
      new Acceptor(std::move(listeners), std::move(wakeup), std::move(on_accept)));
}

Acceptor::Acceptor(std::vector<UniqueFd> listeners, UniqueFd wakeup, OnAccept on_accept)
    : listeners_(std::move(listeners)),
      wakeup_(std::move(wakeup)),
      on_accept_(std::move(on_accept)),
      thread_(&Acceptor::Run, this) {}

Acceptor::~Acceptor() {
  const uint64_t one = 1;
  // An eventfd write of 1 fails only when the counter would overflow, which one
  // write cannot do.
  (void)!write(wakeup_.get(), &one, sizeof(one));
  thread_.join();
}

void Acceptor::Run() {
  NameThisThread("fl-acceptor");
  std::vector<pollfd> watched;
  watched.reserve(listeners_.size() + 1);
  for (const UniqueFd& listener : listeners_) {
    watched.push_back({.fd = listener.get(), .events = POLLIN, .revents = 0});
  }
  watched.push_back({.fd = wakeup_.get(), .events = POLLIN, .revents = 0});
  while (true) {
    if (poll(watched.data(), watched.size(), -1) < 0) {
      if (errno == EINTR) continue;
      // poll() fails only on bad arguments or no memory; back off and retry.
      usleep(kAcceptRetryBackoffMs * 1000);
      continue;
    }
    if (watched.back().revents != 0) return;
    for (size_t nic = 0; nic < listeners_.size(); ++nic) {
      if (watched[nic].revents == 0) continue;
      absl::StatusOr<UniqueFd> accepted = Accept(listeners_[nic].get());
      if (accepted.ok()) {
        on_accept_(static_cast<int>(nic), *std::move(accepted));
      } else if (accepted.status().code() == absl::StatusCode::kResourceExhausted) {
        usleep(kAcceptRetryBackoffMs * 1000);
      }
      // Other failures (the client reset before we accepted) concern one client.
    }
  }
}

}  // namespace fuselink::fabric
