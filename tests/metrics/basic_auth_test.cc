// BasicAuth (services/metrics/http/basic_auth.h) with a verifier the test holds: verified
// credentials are answered from the cache without the worker, wrong ones never
// enter it, an unknown user costs a check all the same, a full queue answers kBusy
// at once, a cancelled check frees its place, and the cache keeps the most
// recently used.
#include "services/metrics/http/basic_auth.h"

#include <poll.h>

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace fuselink::services::http {
namespace {

using Verdict = BasicAuth::Verdict;

// The worker's verifier: a password matches a "hash" equal to it. While closed,
// each call waits until the test opens it.
class Gate {
 public:
  BasicAuth::Verifier verifier() {
    return [this](absl::string_view password, const std::string& hash) {
      absl::MutexLock lock(&mu_);
      calls_.push_back(absl::StrCat(password, "~", hash));
      mu_.Await(absl::Condition(&open_));
      return password == hash;
    };
  }
  void Set(bool open) {
    absl::MutexLock lock(&mu_);
    open_ = open;
  }
  // Waits (bounded) until `n` calls began; the calls so far.
  std::vector<std::string> WaitForCalls(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return calls_;
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

std::optional<std::string> Basic(absl::string_view user, absl::string_view password) {
  return absl::StrCat("Basic ", absl::Base64Escape(absl::StrCat(user, ":", password)));
}

// Waits (bounded by 10 s) for `n` verdicts.
std::vector<BasicAuth::Done> TakeDone(BasicAuth& auth, size_t n) {
  std::vector<BasicAuth::Done> all;
  while (all.size() < n) {
    pollfd ready{auth.ready_fd(), POLLIN, 0};
    if (poll(&ready, 1, 10'000) != 1) break;
    for (const BasicAuth::Done& d : auth.TakeDone()) all.push_back(d);
  }
  return all;
}

std::unique_ptr<BasicAuth> Start(Gate& gate, int depth,
                                 BasicAuth::Users users = {{"prometheus", "right"},
                                                           {"other", "x"}}) {
  absl::StatusOr<std::unique_ptr<BasicAuth>> auth =
      BasicAuth::Start(std::move(users), depth, gate.verifier());
  EXPECT_TRUE(auth.ok()) << auth.status();
  return auth.ok() ? *std::move(auth) : nullptr;
}

TEST(BasicAuth, MissingOrMalformedCredentialsAreDeniedWithoutTheWorker) {
  Gate gate;
  auto auth = Start(gate, 4);
  EXPECT_EQ(auth->Check(std::nullopt, 1), Verdict::kDenied);
  EXPECT_EQ(auth->Check("Bearer x", 2), Verdict::kDenied);
  EXPECT_EQ(auth->Check("Basic !!!", 3), Verdict::kDenied);
  EXPECT_TRUE(gate.WaitForCalls(0).empty());
}

TEST(BasicAuth, RightCredentialsAreCheckedOnceThenCached) {
  Gate gate;
  auto auth = Start(gate, 4);
  ASSERT_EQ(auth->Check(Basic("prometheus", "right"), 7), Verdict::kPending);
  const auto done = TakeDone(*auth, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].ticket, 7u);
  EXPECT_TRUE(done[0].allowed);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(auth->Check(Basic("prometheus", "right"), 8 + i), Verdict::kAllowed);
  }
  EXPECT_EQ(gate.WaitForCalls(1), std::vector<std::string>{"right~right"});
}

TEST(BasicAuth, WrongCredentialsAreCheckedEveryTime) {
  Gate gate;
  auto auth = Start(gate, 4);
  for (uint64_t ticket = 1; ticket <= 2; ++ticket) {
    ASSERT_EQ(auth->Check(Basic("prometheus", "wrong"), ticket), Verdict::kPending);
    const auto done = TakeDone(*auth, 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_FALSE(done[0].allowed);
  }
  EXPECT_EQ(gate.WaitForCalls(2).size(), 2u);
}

TEST(BasicAuth, AnUnknownUserCostsACheckAndIsDenied) {
  Gate gate;
  auto auth = Start(gate, 4);
  // "right" matches the first user's hash, which an unknown user is checked against.
  ASSERT_EQ(auth->Check(Basic("nobody", "right"), 1), Verdict::kPending);
  const auto done = TakeDone(*auth, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].allowed);
  EXPECT_EQ(gate.WaitForCalls(1), std::vector<std::string>{"right~right"});
  // A user's name and password are told apart: "prometheus" + "right" is not
  // "prometheusr" + "ight".
  EXPECT_EQ(auth->Check(Basic("prometheusr", "ight"), 2), Verdict::kPending);
}

TEST(BasicAuth, AFullQueueIsBusyAtOnceAndTakesChecksAgainOnceDrained) {
  Gate gate;
  gate.Set(false);
  auto auth = Start(gate, 2);
  EXPECT_EQ(auth->Check(Basic("prometheus", "a"), 1), Verdict::kPending);
  EXPECT_EQ(auth->Check(Basic("prometheus", "b"), 2), Verdict::kPending);
  EXPECT_EQ(auth->Check(Basic("prometheus", "c"), 3), Verdict::kBusy);
  EXPECT_EQ(auth->Check(Basic("prometheus", "right"), 4), Verdict::kBusy);
  gate.Set(true);
  const auto done = TakeDone(*auth, 2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].ticket, 1u);
  EXPECT_EQ(done[1].ticket, 2u);
  EXPECT_EQ(auth->Check(Basic("prometheus", "right"), 5), Verdict::kPending);
}

TEST(BasicAuth, ACancelledCheckFreesItsPlace) {
  Gate gate;
  gate.Set(false);
  auto auth = Start(gate, 2);
  ASSERT_EQ(auth->Check(Basic("prometheus", "a"), 1), Verdict::kPending);
  ASSERT_EQ(gate.WaitForCalls(1).size(), 1u);  // 1 is being run
  ASSERT_EQ(auth->Check(Basic("prometheus", "b"), 2), Verdict::kPending);
  EXPECT_EQ(auth->Check(Basic("prometheus", "right"), 3), Verdict::kBusy);
  auth->Cancel(2);  // queued: dropped
  auth->Cancel(1);  // running: finishes, and still holds its place until taken
  EXPECT_EQ(auth->Check(Basic("prometheus", "right"), 3), Verdict::kPending);
  EXPECT_EQ(auth->Check(Basic("prometheus", "d"), 4), Verdict::kBusy);
  gate.Set(true);
  const auto done = TakeDone(*auth, 2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].ticket, 1u);
  EXPECT_EQ(done[1].ticket, 3u);
  EXPECT_TRUE(done[1].allowed);
  EXPECT_EQ(gate.WaitForCalls(2).size(), 2u) << "the cancelled check ran";
}

TEST(BasicAuth, TheCacheKeepsTheMostRecentlyUsed) {
  Gate gate;
  BasicAuth::Users users;
  for (size_t i = 0; i <= kMaxCachedCredentials; ++i) {
    users.emplace_back(absl::StrCat("u", i), absl::StrCat("p", i));
  }
  auto auth = Start(gate, 4, users);
  uint64_t ticket = 0;
  auto verify = [&](size_t i) {
    ASSERT_EQ(auth->Check(Basic(users[i].first, users[i].second), ++ticket),
              Verdict::kPending);
    const auto done = TakeDone(*auth, 1);
    ASSERT_EQ(done.size(), 1u);
    ASSERT_TRUE(done[0].allowed);
  };
  for (size_t i = 0; i < kMaxCachedCredentials; ++i) verify(i);
  EXPECT_EQ(auth->Check(Basic("u0", "p0"), ++ticket), Verdict::kAllowed);  // used
  verify(kMaxCachedCredentials);  // one too many: u1, the least recently used, goes
  EXPECT_EQ(auth->Check(Basic("u0", "p0"), ++ticket), Verdict::kAllowed);
  EXPECT_EQ(auth->Check(Basic("u2", "p2"), ++ticket), Verdict::kAllowed);
  EXPECT_EQ(auth->Check(Basic("u1", "p1"), ++ticket), Verdict::kPending);
}

TEST(BasicAuth, RefusesWhatCannotBeBounded) {
  EXPECT_EQ(BasicAuth::Start({}, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BasicAuth::Start({{"a", "b"}}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BasicAuth::Start({{"a", "b"}}, kMaxAuthQueueDepth + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fuselink::services::http
