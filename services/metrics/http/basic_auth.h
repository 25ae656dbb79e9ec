// HTTP basic auth for the /metrics server, with bcrypt kept off the server's poll
// thread. bcrypt is slow on purpose (tens of milliseconds at cost 10, seconds at
// cost 16): run on the poll thread, each wrong guess would hold every scrape behind
// it. So:
//  - credentials that verified once are remembered (SHA-256 of user and password, the
//    kMaxCachedCredentials most recently used): a scraper's every later scrape is
//    answered on the poll thread without bcrypt. Only verified credentials enter,
//    so guesses cannot push a scraper's out;
//  - any other check goes to one worker thread through a queue, and its verdict
//    comes back through ready_fd(); at most `queue_depth` checks are outstanding
//    (waiting, being run, or finished and not yet taken);
//  - a full queue is answered at once (kBusy: the server answers 503), so guessers
//    cost at most one core and a queue's worth of waiting, never a cached scrape's.
// An unknown user costs a bcrypt like a known one, so that timing does not tell
// which users exist.
//
// Thread contract: Check, TakeDone and Cancel on the server's thread only (the cache
// is that thread's alone); the worker thread runs bcrypt and nothing else.
#pragma once

#include <openssl/sha.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace fuselink::services::http {

// Verified credentials remembered: one per scraper is enough.
inline constexpr size_t kMaxCachedCredentials = 16;
// Checks outstanding at once: a new scraper waits behind at most this many bcrypts
// less one; past it, 503 at once.
inline constexpr int kDefaultAuthQueueDepth = 4;
inline constexpr int kMaxAuthQueueDepth = 1024;

class BasicAuth {
 public:
  using Users = std::vector<std::pair<std::string, std::string>>;  // name, bcrypt hash
  enum class Verdict {
    kAllowed,  // cached, verified
    kDenied,   // no or malformed credentials
    kPending,  // queued: the verdict comes from TakeDone under `ticket`
    kBusy,     // the queue is full: answer at once, check nothing
  };
  struct Done {
    uint64_t ticket;
    bool allowed;
  };

  // Whether a password matches a hash; run on the worker. BcryptMatches but in tests.
  using Verifier =
      std::function<bool(absl::string_view password, const std::string& hash)>;

  // Starts the worker. INVALID_ARGUMENT when `users` is empty or queue_depth is
  // outside [1, kMaxAuthQueueDepth]; UNAVAILABLE when no eventfd can be made.
  static absl::StatusOr<std::unique_ptr<BasicAuth>> Start(Users users, int queue_depth,
                                                          Verifier verify = {});
  // Stops the worker: a bcrypt in progress finishes first (its cost, at most).
  ~BasicAuth();
  BasicAuth(const BasicAuth&) = delete;
  BasicAuth& operator=(const BasicAuth&) = delete;

  // The Authorization header's value, if any. Never blocks.
  Verdict Check(const std::optional<std::string>& authorization, uint64_t ticket);
  // Verdicts finished since the last call (at most queue_depth); remembers the
  // allowed ones. Call when ready_fd() is readable. Never blocks.
  std::vector<Done> TakeDone();
  // Drops a queued check (its connection went); one being run finishes unseen.
  void Cancel(uint64_t ticket);
  // Readable while verdicts wait in TakeDone (an eventfd).
  int ready_fd() const { return ready_fd_; }

 private:
  using Digest = std::array<unsigned char, SHA256_DIGEST_LENGTH>;
  struct Job {
    uint64_t ticket;
    std::string password;
    const std::string* hash;  // the user's, or the first user's for an unknown one
    bool known_user;
    Digest digest;
  };
  struct Finished {
    uint64_t ticket;
    bool allowed;
    Digest digest;
  };
  BasicAuth(Users users, int queue_depth, int ready_fd, Verifier verify);
  void Work();
  bool Cached(const Digest& digest);  // and marks it most recently used
  void Remember(const Digest& digest);

  const Users users_;
  const size_t queue_depth_;
  const int ready_fd_;
  const Verifier verify_;
  std::deque<Digest> verified_;  // server thread only; most recently used last
  size_t outstanding_ = 0;       // server thread only; at most queue_depth_
  absl::Mutex mu_;
  // Together at most queue_depth_ (outstanding_ counts both, and the one running).
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<Finished> finished_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace fuselink::services::http
