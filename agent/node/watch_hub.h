// Fans out the ends of transfers (incoming, or outgoing) to WatchTransfers streams. Each
// stream has a bounded queue; a stream that falls kMaxQueuedWatchEvents behind is ended
// RESOURCE_EXHAUSTED rather than grown; an identity holds at most its share of streams
// (--max_watches_per_identity), so that one viewer cannot make every landing's
// event copy unbounded. Stream state lives here, under the hub's
// lock, and the sink is called with no lock held, at most one write outstanding.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/stats.h"
#include "fuselink/v1/agent.pb.h"

namespace fuselink::services {

inline constexpr size_t kMaxQueuedWatchEvents = 1024;
// Watch streams one identity holds open at once, by default.
inline constexpr size_t kDefaultWatchesPerIdentity = 16;

class WatchSink {
 public:
  virtual ~WatchSink() = default;
  virtual void SendEvent(const v1::WatchEvent* event) = 0;
  virtual void End(const absl::Status& status) = 0;
};

class WatchHub {
 public:
  struct Watcher;

  explicit WatchHub(size_t max_per_identity = kDefaultWatchesPerIdentity);
  ~WatchHub();

  // Stores the handle in `*handle` before the sink's first call.
  // `outgoing`: the sink hears transfers this node sent, not those it received.
  // `identity` (the caller; "" under open access) holds the stream until Remove.
  // RESOURCE_EXHAUSTED (WATCH_SHARE), counted, when it already holds
  // max_per_identity: then nothing is added and the sink is never called.
  absl::Status Add(WatchSink* sink, std::string identity, std::string tensor,
                   bool outgoing, Watcher** handle);
  void OnWriteDone(Watcher* watcher, bool ok);
  void OnCancel(Watcher* watcher);
  // The sink is done for good.
  void Remove(Watcher* watcher);
  void Publish(const v1::WatchEvent& event);
  // Ends every stream (the agent is stopping).
  void Close();
  size_t size() const;
  // Adds refused WATCH_SHARE.
  uint64_t share_refusals() const;

  // Watches refused past an identity's share.
  void ReportStats(stats::Sink& sink) const;

 private:
  struct Action {
    WatchSink* sink;
    const v1::WatchEvent* event;  // null: Finish with status
    absl::Status status;
  };
  using Actions = absl::InlinedVector<Action, 4>;
  void Advance(Watcher* w, Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Run(const Actions& actions);

  const size_t max_per_identity_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Watcher>> watchers_ ABSL_GUARDED_BY(mu_);
  // Streams held, by identity; an identity with none has no entry.
  absl::flat_hash_map<std::string, size_t> held_ ABSL_GUARDED_BY(mu_);
  uint64_t share_refusals_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fuselink::services
