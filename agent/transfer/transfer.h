// One transfer on its source node: identity, state, counters, and the streams that
// follow it. The engine moves the bytes; this type keeps the record and turns it
// into events for each stream. Thread-safe: everything mutable is under mu().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fuselink/v1/agent.pb.h"

namespace fuselink::transfer {

enum class State {
  kPreparing,  // waiting for the target to accept
  kRunning,    // posting chunks
  kStopping,   // failed or cancelled; waiting for chunks in flight to drain
  kCompleted,
  kFailed,
  kCancelled,
};

bool IsTerminal(State s);

// Where a stream's events go: a gRPC reactor in production, a fake in tests.
// Transfer calls these with no lock held, at most one write outstanding per stream.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void SendEvent(const v1::TransferEvent* event) = 0;
  // The last call; `status` is OK after `completed`, else the failure.
  virtual void End(const absl::Status& status) = 0;
};

class Transfer {
 public:
  struct Subscription;

  Transfer(std::string id, v1::TransferRequest request, std::string fingerprint,
           std::vector<std::string> nic_names, absl::Time deadline);
  ~Transfer();

  const std::string& id() const { return id_; }
  const std::string& request_id() const { return request_.request_id(); }
  const std::string& fingerprint() const { return fingerprint_; }
  const v1::TransferRequest& request() const { return request_; }
  absl::Time deadline() const { return deadline_; }

  // Streams. Subscribe stores the handle the sink passes back in `*handle` before
  // the sink's first call; the sink's calls happen on the caller's thread or on the
  // engine's.
  void Subscribe(EventSink* sink, Subscription** handle);
  void OnWriteDone(Subscription* sub, bool ok);
  // The client went away: no more writes; the sink is finished now or after its
  // write in flight.
  void OnStreamCancelled(Subscription* sub);
  // The sink is done for good; the handle is freed.
  void Unsubscribe(Subscription* sub);

  v1::TransferStatus Status() const;
  State state() const;

  // --- Called by the engine. ---
  absl::Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }
  // The target accepted: the transfer runs. Accept tells the streams; AcceptLocked
  // leaves that to a Notify once the lock is released.
  void Accept(uint64_t total_bytes, uint64_t chunks, uint32_t layers_begin,
              uint32_t layer_count, absl::string_view transport,
              absl::string_view policy);
  void AcceptLocked(uint64_t total_bytes, uint64_t chunks, uint32_t layers_begin,
                    uint32_t layer_count, absl::string_view transport,
                    absl::string_view policy) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a landed chunk; the engine calls it once per chunk, however often the
  // chunk was sent. Returns true when this finished the chunk's layer.
  bool AddDone(int nic, uint32_t layer, uint64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves to `state`; for failures `status` says why.
  void SetState(State state, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With a final state set: nobody hears of it (streams, Status) until ReleaseEnd,
  // which the engine calls once it let go of what the transfer held (its source
  // tensor, its requester's share), so that a caller who hears the end finds both
  // free. ReleaseEnd takes the lock; Notify afterwards.
  void HoldEnd() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { end_held_ = true; }
  void ReleaseEnd();
  State state_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return state_; }
  bool all_done_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return bytes_done_ == total_bytes_;
  }
  const absl::Status& failure_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return failure_;
  }
  absl::Duration elapsed_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t total_bytes_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return total_bytes_;
  }
  uint64_t bytes_done_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return bytes_done_;
  }
  // Tells streams what changed. Call with mu() released; progress alone is
  // throttled to `progress_interval`.
  void Notify(bool progress_only, absl::Duration progress_interval);
  absl::Time finished_at() const;

 private:
  struct Action {
    EventSink* sink;
    const v1::TransferEvent* event;  // null: Finish
    absl::Status status;
  };
  using Actions = absl::InlinedVector<Action, 4>;
  // Fills the subscription's next event if it has one and no write is outstanding.
  void Advance(Subscription* sub, Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillProgress(v1::Progress* progress) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FinalStatus() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Run(const Actions& actions);

  const std::string id_;
  const v1::TransferRequest request_;
  const std::string fingerprint_;
  const std::vector<std::string> nic_names_;
  const absl::Time deadline_;
  const absl::Time created_ = absl::Now();

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kPreparing;
  bool end_held_ ABSL_GUARDED_BY(mu_) = false;  // HoldEnd
  // Whether callers may hear that the transfer ended.
  bool EndHeard() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return IsTerminal(state_) && !end_held_;
  }
  bool accepted_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::string transport_ ABSL_GUARDED_BY(mu_);
  std::string policy_ ABSL_GUARDED_BY(mu_);
  uint64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t chunks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_done_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> nic_bytes_ ABSL_GUARDED_BY(mu_);
  uint32_t layer_begin_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> layer_left_bytes_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> layers_done_ ABSL_GUARDED_BY(mu_);  // in finishing order
  absl::Time started_ ABSL_GUARDED_BY(mu_);
  absl::Time finished_ ABSL_GUARDED_BY(mu_);
  absl::Time last_progress_notify_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Subscription>> subs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fuselink::transfer
