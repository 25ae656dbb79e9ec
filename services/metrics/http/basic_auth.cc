#include "services/metrics/http/basic_auth.h"

#include <openssl/crypto.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "services/metrics/http/http_request.h"
#include "services/metrics/http/web_config.h"

namespace fuselink::services::http {

absl::StatusOr<std::unique_ptr<BasicAuth>> BasicAuth::Start(Users users, int queue_depth,
                                                            Verifier verify) {
  if (users.empty()) return absl::InvalidArgumentError("basic auth without users");
  if (queue_depth < 1 || queue_depth > kMaxAuthQueueDepth) {
    return absl::InvalidArgumentError(absl::StrCat("basic auth queue depth ", queue_depth,
                                                   " outside [1, ", kMaxAuthQueueDepth,
                                                   "]"));
  }
  const int ready_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ready_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("eventfd for basic auth: ", std::strerror(errno)));
  }
  if (!verify) verify = BcryptMatches;
  return std::unique_ptr<BasicAuth>(
      new BasicAuth(std::move(users), queue_depth, ready_fd, std::move(verify)));
}

BasicAuth::BasicAuth(Users users, int queue_depth, int ready_fd, Verifier verify)
    : users_(std::move(users)),
      queue_depth_(static_cast<size_t>(queue_depth)),
      ready_fd_(ready_fd),
      verify_(std::move(verify)) {
  worker_ = std::thread([this] { Work(); });
}

BasicAuth::~BasicAuth() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  worker_.join();
  close(ready_fd_);
}

BasicAuth::Verdict BasicAuth::Check(const std::optional<std::string>& authorization,
                                    uint64_t ticket) {
  if (!authorization.has_value()) return Verdict::kDenied;
  std::optional<BasicCredentials> credentials = ParseBasicAuth(*authorization);
  if (!credentials.has_value()) return Verdict::kDenied;
  Job job{ticket, std::move(credentials->password), &users_[0].second, false, {}};
  // The user's length first, so that user "a" with password "bc" and user "ab"
  // with password "c" differ.
  const std::string keyed =
      absl::StrCat(credentials->user.size(), ":", credentials->user, job.password);
  SHA256(reinterpret_cast<const unsigned char*>(keyed.data()), keyed.size(),
         job.digest.data());
  if (Cached(job.digest)) return Verdict::kAllowed;
  for (const auto& [user, hash] : users_) {
    if (user == credentials->user) {
      job.hash = &hash;
      job.known_user = true;
    }
  }
  if (outstanding_ >= queue_depth_) return Verdict::kBusy;
  ++outstanding_;
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(job));
  return Verdict::kPending;
}

std::vector<BasicAuth::Done> BasicAuth::TakeDone() {
  uint64_t count;
  if (read(ready_fd_, &count, sizeof(count)) < 0 && errno != EAGAIN) {
    std::fprintf(stderr, "fuselink metrics server: basic auth eventfd: %s\n",
                 std::strerror(errno));
  }
  std::vector<Finished> finished;
  {
    absl::MutexLock lock(&mu_);
    finished.swap(finished_);
  }
  std::vector<Done> done;
  done.reserve(finished.size());
  outstanding_ -= finished.size();
  for (const Finished& f : finished) {
    if (f.allowed) Remember(f.digest);
    done.push_back({f.ticket, f.allowed});
  }
  return done;
}

void BasicAuth::Cancel(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  outstanding_ -=
      std::erase_if(queue_, [ticket](const Job& job) { return job.ticket == ticket; });
}

void BasicAuth::Work() {
  NameThisThread("fl-basic-auth");
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const bool match = verify_(job.password, *job.hash);
    {
      absl::MutexLock lock(&mu_);
      finished_.push_back({job.ticket, match && job.known_user, job.digest});
    }
    const uint64_t one = 1;
    if (write(ready_fd_, &one, sizeof(one)) != sizeof(one)) {
      std::fprintf(stderr, "fuselink metrics server: basic auth eventfd: %s\n",
                   std::strerror(errno));
    }
  }
}

bool BasicAuth::Cached(const Digest& digest) {
  for (auto it = verified_.begin(); it != verified_.end(); ++it) {
    if (CRYPTO_memcmp(it->data(), digest.data(), digest.size()) == 0) {
      std::rotate(it, it + 1, verified_.end());  // most recently used last
      return true;
    }
  }
  return false;
}

void BasicAuth::Remember(const Digest& digest) {
  if (Cached(digest)) return;  // two checks of the same credentials in flight
  if (verified_.size() == kMaxCachedCredentials) verified_.pop_front();
  verified_.push_back(digest);
}

}  // namespace fuselink::services::http
