// How long a source waits for the target's verdict, and when it asks for it instead.
// The target tells a slot's end with a verdict notice on the fabric (imm.h); a notice
// can be lost (a full notifier queue, a connection that dropped), so a source that
// hears nothing asks over the control channel (PeerLink::QueryVerdict), a bounded
// number of times, and ends with a fallback status when no answer can be had.
//
//  - After the commit landed: ask once notice_wait has passed, then every
//    query_every while the target holds the transfer open, until give_up_after or the
//    transfer's deadline (but always one wait and one question); then the fallback
//    (UNAVAILABLE NO_VERDICT: the source cannot know how the target ended it).
//  - After a refusal: ask once notice_wait has passed; a target that still holds the
//    transfer open has not decided, and the transfer ends with the refusal itself.
//  - A question that fails (NOT_FOUND, UNAVAILABLE) is asked again, at most
//    max_query_errors times in all.
// Pure: time comes in as arguments. Not thread-safe (the job's lock guards it).
#pragma once

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace fuselink::transfer {

struct VerdictWaitOptions {
  // How long a verdict notice may take before the source asks.
  absl::Duration notice_wait = absl::Seconds(1);
  // Between two questions while the target still holds the transfer open.
  absl::Duration query_every = absl::Seconds(1);
  // Bound on one question.
  absl::Duration query_timeout = absl::Seconds(1);
  // Questions that fail before the source gives up.
  int max_query_errors = 3;
  // After the commit landed: how long the source waits for a verdict at most.
  absl::Duration give_up_after = absl::Seconds(30);
};

class VerdictWait {
 public:
  enum class Why { kCommitted, kRefused };
  enum class Step { kNone, kAsk, kGiveUp };
  struct Answer {
    bool done = false;
    absl::Status status;       // the transfer's end, when done
    bool from_target = false;  // the target's own verdict (no abort is owed)
  };

  explicit VerdictWait(VerdictWaitOptions options) : options_(options) {}

  // Starts waiting at `now`; `fallback` is the end when no verdict can be had.
  void Start(Why why, absl::Time now, absl::Time deadline, absl::Status fallback);
  bool active() const { return active_; }
  bool asking() const { return asking_; }
  // When OnTimer is due next; InfiniteFuture while inactive or while a question is out.
  absl::Time next() const;
  // kAsk: ask now (a question is then out until OnReply).
  Step OnTimer(absl::Time now);
  Answer OnReply(const absl::StatusOr<std::optional<absl::Status>>& reply,
                 absl::Time now);
  const absl::Status& fallback() const { return fallback_; }
  absl::Time QueryDeadline(absl::Time now) const { return now + options_.query_timeout; }

 private:
  const VerdictWaitOptions options_;
  bool active_ = false;
  bool asking_ = false;
  Why why_ = Why::kCommitted;
  absl::Time next_ask_ = absl::InfiniteFuture();
  absl::Time give_up_ = absl::InfiniteFuture();
  int asked_ = 0;
  int errors_ = 0;
  absl::Status fallback_;
};

// UNAVAILABLE (NO_VERDICT): the target's verdict could not be had.
absl::Status NoVerdictStatus(absl::string_view target_node);

}  // namespace fuselink::transfer
