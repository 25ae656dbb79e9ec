// The verbs NIC's sender of deferred writes (verbs/staged_sender.h), without NICs or
// GPUs: writes that claim a bounce slot and hold it as long as the test says, as a
// write to a stopped target holds its slot until it fails. A peer holding its share
// holds up no other peer, never holds more than its share, goes on in its order once
// its slots return, and Stop ends every queued write exactly once.
#include "agent/fabric/verbs/staged_sender.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/fabric/verbs/fabric.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"

namespace fuselink::fabric::verbs {
namespace {

using Outcome = StagedSender::Outcome;

constexpr PeerId kA = 1;  // its target is stopped: its slots return when the test says
constexpr PeerId kB = 2;  // its writes complete at once: their slots return at once
constexpr PeerId kC = 3;

// What became of every write, and the claims of the writes still "in flight".
class Ledger {
 public:
  explicit Ledger(StagedSender& sender) : sender_(sender) {}

  // A posted write whose peer held `held` claims with its own; `claim`, when not
  // null, stays held (its write is in flight).
  void Posted(PeerId peer, int seq, uint32_t held, std::shared_ptr<const void> claim) {
    absl::MutexLock lock(&mu_);
    posted_[peer].push_back(seq);
    if (held > most_held_[peer]) most_held_[peer] = held;
    if (claim != nullptr) kept_[peer].push_back(std::move(claim));
  }
  void Abandoned(PeerId peer, int seq, const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    abandoned_[peer].push_back(seq);
    codes_.push_back(why.code());
  }
  // Lets go of `peer`'s kept claims: its writes in flight completed.
  void Complete(PeerId peer) {
    std::vector<std::shared_ptr<const void>> done;
    {
      absl::MutexLock lock(&mu_);
      done.swap(kept_[peer]);
    }
    done.clear();  // unlocked: a claim's return takes the sender's lock
  }
  // Waits (kWaitTimeout) until `peer` has `count` posted writes; whether it has.
  bool WaitForPosted(PeerId peer, size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return posted_[peer].size() >= count;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), testing::kWaitTimeout);
  }
  std::vector<int> posted(PeerId peer) {
    absl::MutexLock lock(&mu_);
    return posted_[peer];
  }
  std::vector<int> abandoned(PeerId peer) {
    absl::MutexLock lock(&mu_);
    return abandoned_[peer];
  }
  uint32_t most_held(PeerId peer) {
    absl::MutexLock lock(&mu_);
    return most_held_[peer];
  }
  std::vector<absl::StatusCode> codes() {
    absl::MutexLock lock(&mu_);
    return codes_;
  }

 private:
  StagedSender& sender_;
  absl::Mutex mu_;
  std::map<PeerId, std::vector<int>> posted_ ABSL_GUARDED_BY(mu_);
  std::map<PeerId, std::vector<int>> abandoned_ ABSL_GUARDED_BY(mu_);
  std::map<PeerId, uint32_t> most_held_ ABSL_GUARDED_BY(mu_);
  std::map<PeerId, std::vector<std::shared_ptr<const void>>> kept_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::StatusCode> codes_ ABSL_GUARDED_BY(mu_);
};

// A staged write: claims a slot, "stages and posts" (records itself), and keeps the
// claim while its write is in flight (`keep`), or lets go at once. `retries` times
// first it answers kRetry `retry_after` later, as a write meeting a spent quota.
class FakeWrite : public StagedSender::Write {
 public:
  struct Params {
    PeerId peer = 0;
    int seq = 0;
    bool keep = false;
    int retries = 0;
    absl::Duration retry_after = absl::ZeroDuration();
  };
  FakeWrite(StagedSender& sender, Ledger& ledger, Params params, int* tries = nullptr)
      : sender_(sender), ledger_(ledger), p_(params), tries_(tries) {}

  StagedSender::Step Try() override {
    if (tries_ != nullptr) ++*tries_;  // read by the test only once the write ended
    if (p_.retries > 0) {
      --p_.retries;
      return {.outcome = Outcome::kRetry, .retry_at = absl::Now() + p_.retry_after};
    }
    std::shared_ptr<const void> claim = sender_.TryClaimSlot(p_.peer);
    if (claim == nullptr) return {.outcome = Outcome::kNoSlot};
    const uint32_t held = sender_.slots_held(p_.peer);
    if (!p_.keep) claim.reset();  // completed at once: recorded once it let go
    ledger_.Posted(p_.peer, p_.seq, held, std::move(claim));
    return {.outcome = Outcome::kDone};
  }
  void Abandon(const absl::Status& why) override {
    ledger_.Abandoned(p_.peer, p_.seq, why);
  }

 private:
  StagedSender& sender_;
  Ledger& ledger_;
  Params p_;
  int* tries_;
};

class StagedSenderTest : public ::testing::Test {
 protected:
  // 4 slots, 2 a peer: the default share (half).
  StagedSenderTest() : sender_("fl-test-send", 4, 2), ledger_(sender_) {}
  ~StagedSenderTest() override {
    sender_.Stop();
    for (PeerId peer : {kA, kB, kC}) ledger_.Complete(peer);  // before the sender dies
  }

  void Queue(FakeWrite::Params params, int* tries = nullptr) {
    sender_.Queue(params.peer,
                  std::make_unique<FakeWrite>(sender_, ledger_, params, tries));
  }
  static std::vector<int> Seqs(int from, int to) {
    std::vector<int> seqs;
    for (int i = from; i < to; ++i) seqs.push_back(i);
    return seqs;
  }

  StagedSender sender_;
  Ledger ledger_;
};

// (a) A's writes are stuck holding its share; B's, queued after all of A's, are
// staged and posted all the same, and A's waiting write is not tried over and over.
TEST_F(StagedSenderTest, APeerHoldingItsShareHoldsUpNoOtherPeer) {
  int waiting_tries = 0;
  for (int i = 0; i < 5; ++i) {
    Queue({.peer = kA, .seq = i, .keep = true}, i == 2 ? &waiting_tries : nullptr);
  }
  ASSERT_TRUE(ledger_.WaitForPosted(kA, 2));
  constexpr int kWritesOfB = 6;  // more than the slots: each returns before the next
  for (int i = 0; i < kWritesOfB; ++i) Queue({.peer = kB, .seq = i});

  ASSERT_TRUE(ledger_.WaitForPosted(kB, kWritesOfB));
  EXPECT_EQ(ledger_.posted(kB), Seqs(0, kWritesOfB));
  EXPECT_EQ(ledger_.posted(kA), Seqs(0, 2)) << "A went past its share";
  EXPECT_EQ(sender_.slots_held(kA), 2u);
  EXPECT_EQ(sender_.slots_held(kB), 0u);
  // Tried again after each of B's returns, but one write waiting: counted once.
  EXPECT_EQ(sender_.share_waits(), 1u);
  // Tried when it came up, and again only when a slot came back (B's six).
  sender_.Stop();  // ends A's waiting writes, so that `waiting_tries` may be read
  EXPECT_GE(waiting_tries, 1);
  EXPECT_LE(waiting_tries, 1 + kWritesOfB + 1) << "a write that cannot go on spun";
}

// (b) Three peers whose writes all stay in flight: none holds more than its share at
// any claim, and together they hold every slot and no more.
TEST_F(StagedSenderTest, NoPeerHoldsMoreThanItsShare) {
  for (int i = 0; i < 4; ++i) {
    for (PeerId peer : {kA, kB, kC}) Queue({.peer = peer, .seq = i, .keep = true});
  }
  auto posted = [&] {
    return ledger_.posted(kA).size() + ledger_.posted(kB).size() +
           ledger_.posted(kC).size();
  };
  for (int i = 0; i < 1000 && posted() < 4; ++i) absl::SleepFor(absl::Milliseconds(10));
  absl::SleepFor(absl::Milliseconds(50));  // time to go wrong
  EXPECT_EQ(posted(), 4u) << "all slots in use, and no more";
  for (PeerId peer : {kA, kB, kC}) {
    EXPECT_LE(ledger_.most_held(peer), sender_.slots_per_peer()) << "peer " << peer;
    EXPECT_LE(ledger_.posted(peer).size(), 2u) << "peer " << peer;
  }
  EXPECT_EQ(sender_.slots_held(kA) + sender_.slots_held(kB) + sender_.slots_held(kC), 4u);
  // Directly: one peer's third claim is refused while it holds two.
  StagedSender alone("fl-test-send", 3, 2);
  std::shared_ptr<const void> first = alone.TryClaimSlot(kA);
  std::shared_ptr<const void> second = alone.TryClaimSlot(kA);
  EXPECT_NE(first, nullptr);
  EXPECT_NE(second, nullptr);
  EXPECT_EQ(alone.TryClaimSlot(kA), nullptr);
  std::shared_ptr<const void> other = alone.TryClaimSlot(kB);
  EXPECT_NE(other, nullptr);
  EXPECT_EQ(alone.TryClaimSlot(kC), nullptr) << "past the slots";
  first.reset();
  EXPECT_EQ(alone.slots_held(kA), 1u);
  EXPECT_NE(alone.TryClaimSlot(kC), nullptr);  // let go of at once
}

// (c) Once A's writes in flight complete, its queued writes go on, in their order.
TEST_F(StagedSenderTest, ReturnedSlotsLetAPeersQueuedWritesGoOnInOrder) {
  constexpr int kWrites = 6;
  for (int i = 0; i < kWrites; ++i) Queue({.peer = kA, .seq = i, .keep = true});
  ASSERT_TRUE(ledger_.WaitForPosted(kA, 2));
  absl::SleepFor(absl::Milliseconds(50));  // time to go wrong
  EXPECT_EQ(ledger_.posted(kA), Seqs(0, 2));
  EXPECT_EQ(sender_.share_waits(), 1u);  // write 2
  ledger_.Complete(kA);
  ASSERT_TRUE(ledger_.WaitForPosted(kA, 4));
  // Write 4 comes up against the share (and write 3 may have, between the returns).
  for (int i = 0; i < 500 && sender_.share_waits() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(ledger_.posted(kA), Seqs(0, 4));
  EXPECT_GE(sender_.share_waits(), 2u);
  EXPECT_LE(sender_.share_waits(), 3u);
  ledger_.Complete(kA);
  ASSERT_TRUE(ledger_.WaitForPosted(kA, kWrites));
  EXPECT_EQ(ledger_.posted(kA), Seqs(0, kWrites));
  EXPECT_LE(sender_.share_waits(), 4u) << "a write counted twice";  // writes 2..5
}

// A write that meets a spent quota waits for its retry without holding up another
// peer, and its peer's later writes stay behind it.
TEST_F(StagedSenderTest, AWriteWaitingToRetryHoldsUpOnlyItsOwnPeer) {
  const absl::Time start = absl::Now();
  Queue({.peer = kA, .seq = 0, .retries = 2, .retry_after = absl::Milliseconds(150)});
  Queue({.peer = kA, .seq = 1});
  for (int i = 0; i < 3; ++i) Queue({.peer = kB, .seq = i});
  ASSERT_TRUE(ledger_.WaitForPosted(kB, 3));
  EXPECT_TRUE(ledger_.posted(kA).empty()) << "A's retry came early";
  ASSERT_TRUE(ledger_.WaitForPosted(kA, 2));
  EXPECT_EQ(ledger_.posted(kA), Seqs(0, 2));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
}

// (d) Stop with writes waiting for a slot, for a retry and for their turn: every one
// ends exactly once, posted or abandoned UNAVAILABLE, and Stop does not wait for the
// slots or the retry. A write queued after Stop is abandoned at once.
TEST_F(StagedSenderTest, StopEndsEveryQueuedWrite) {
  for (int i = 0; i < 5; ++i) Queue({.peer = kA, .seq = i, .keep = true});
  Queue({.peer = kB, .seq = 0, .retries = 1000, .retry_after = absl::Hours(1)});
  Queue({.peer = kB, .seq = 1});
  ASSERT_TRUE(ledger_.WaitForPosted(kA, 2));
  for (int i = 0; i < 3; ++i) Queue({.peer = kC, .seq = i});

  const absl::Time start = absl::Now();
  sender_.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  Queue({.peer = kC, .seq = 3});

  auto ended = [&](PeerId peer) {
    std::vector<int> seqs = ledger_.posted(peer);
    for (int seq : ledger_.abandoned(peer)) seqs.push_back(seq);
    std::sort(seqs.begin(), seqs.end());
    return seqs;
  };
  EXPECT_EQ(ended(kA), Seqs(0, 5));
  EXPECT_EQ(ledger_.abandoned(kA), Seqs(2, 5)) << "A's share was full";
  EXPECT_EQ(ended(kB), Seqs(0, 2));
  EXPECT_EQ(ledger_.abandoned(kB), std::vector<int>{0});
  EXPECT_EQ(ledger_.posted(kB), std::vector<int>{1});
  EXPECT_EQ(ended(kC), Seqs(0, 4));
  EXPECT_EQ(ledger_.abandoned(kC), std::vector<int>{3}) << "queued after Stop";
  for (absl::StatusCode code : ledger_.codes()) {
    EXPECT_EQ(code, absl::StatusCode::kUnavailable);
  }
  EXPECT_EQ(ledger_.codes().size(), 5u);
}

// The fabric's option: a peer's share is at most the NIC's slots (0: half of them).
// Options are checked before any NIC is looked for, so this runs without one.
TEST(VerbsStagingOptions, ThePeersDefaultShareIsThreeQuartersAndLeavesOneToOthers) {
  EXPECT_EQ(DefaultSlotsPerPeer(1), 1u);
  EXPECT_EQ(DefaultSlotsPerPeer(2), 1u);
  EXPECT_EQ(DefaultSlotsPerPeer(4), 3u);
  EXPECT_EQ(DefaultSlotsPerPeer(8), 6u);
  EXPECT_EQ(DefaultSlotsPerPeer(4096), 3072u);
}

TEST(VerbsStagingOptions, APeersShareIsAtMostTheSlotsOfANic) {
  testing::KeyRing keys;
  testing::RecordingHandler events;
  VerbsFabricOptions options;
  options.node_name = "a";
  options.nics = {Endpoint{.nic = 0, .address = "127.0.0.1", .port = 0}};
  options.keys = keys.For("a");
  options.staging_slots_per_nic = 8;
  for (uint32_t share : {0u, 1u, 8u, 9u}) {
    options.staging_slots_per_peer = share;
    const absl::Status status = CreateVerbsFabric(options, &events).status();
    const bool refused = status.code() == absl::StatusCode::kInvalidArgument &&
                         absl::StrContains(status.message(), "staging_slots_per_peer");
    EXPECT_EQ(refused, share > 8) << "a share of " << share << ": " << status;
  }
}

}  // namespace
}  // namespace fuselink::fabric::verbs
