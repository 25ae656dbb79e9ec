// Sends small notices — a target's verdicts and idle-NIC masks — to other agents on
// the fabric, without ever blocking the caller (the landing, on fabric threads).
//
// A notice to a node with a live fabric session is posted at once by the sender
// thread; a full NIC queue delays it (it is tried again), it never drops it. A node
// without a session is handed to the connector thread, which bootstraps it (that can
// take seconds) while the sender goes on serving every other node; its notices wait,
// bounded, and go once it is up. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/fabric/fabric.h"
#include "agent/peer/peer_directory.h"

namespace fuselink::peer {

// Notices queued at once, over every node; past it the oldest idle mask, then the
// oldest notice, is dropped and counted (a source that misses a verdict asks for it
// over gRPC, and idle masks are superseded by the next).
inline constexpr size_t kMaxQueuedNotices = 2 * 4096;

class Notifier {
 public:
  // `is_idle_mask(imm)` tells the notices that a later one supersedes.
  Notifier(fabric::Fabric* fabric, PeerDirectory* peers, bool (*is_idle_mask)(uint32_t));
  ~Notifier();
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  // Queues a notice; a no-op once stopped.
  void Send(const std::string& node, uint32_t imm);
  // Stops and joins the threads: nothing is posted afterwards. Idempotent.
  void Stop();
  uint64_t dropped() const;

 private:
  struct Notice {
    std::string node;
    uint32_t imm;
  };
  void SendLoop();
  void ConnectLoop();
  // Makes room for one more notice.
  void DropOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t QueuedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  fabric::Fabric* const fabric_;
  PeerDirectory* const peers_;
  bool (*const is_idle_mask_)(uint32_t);

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Notice> ready_ ABSL_GUARDED_BY(mu_);
  // Notices for nodes being connected, and the nodes the connector works through.
  std::map<std::string, std::deque<uint32_t>> parked_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> to_connect_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread sender_;
  std::thread connector_;
};

}  // namespace fuselink::peer
