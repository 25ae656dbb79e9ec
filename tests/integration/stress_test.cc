// Many transfers at once, through the public API only: some cancelled once
// accepted, some with deadlines of milliseconds, more than --max_transfers admits,
// and node-b killed and started again while transfers run. Whatever the timing:
//   - every call ends, well before its own gRPC deadline;
//   - each ends `completed`, or with an error that carries a reason (and, after
//     `accepted`, a last `failed` event with the same code and reason);
//   - the bytes of every completed transfer are exactly the source's at the far
//     end, and GetTransfer says COMPLETED of it;
//   - a cancel that succeeded ends its transfer CANCELLED;
//   - both agents serve at the end.
// Seconds with the plain build; it is meant for the TSan build, where it shakes the
// engine, the landing and the fabric on real agents.
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"

namespace fuselink::testing {
namespace {

constexpr uint32_t kSourceBlocks = 64;
constexpr uint32_t kTargetBlocks = 8;  // each transfer fills one target tensor
constexpr uint64_t kBlockBytes = 256 << 10;
constexpr uint64_t kSourceSeed = 7;
// Transfers launched at once; more than --max_transfers, so some are refused.
constexpr int kConcurrent = 24;
constexpr int kMaxTransfers = 16;
// Each call's own deadline: a call that reaches it has hung (gRPC's
// DEADLINE_EXCEEDED carries no reason, so the reason check fails it too).
constexpr absl::Duration kStressCallTimeout = absl::Seconds(45);
// 2 MiB per transfer in 4 KiB chunks, one in flight: tens of milliseconds each, so
// that most are still running when the test cancels them, their deadline passes or
// node-b stops.
const std::vector<std::string> kSlowFlags = {
    "--chunk_bytes=4096", "--window_chunks=1",
    absl::StrCat("--max_transfers=", kMaxTransfers)};

enum class Kind { kPlain, kCancelled, kShortDeadline };

struct Launched {
  std::string request_id;
  Kind kind = Kind::kPlain;
  std::vector<uint32_t> source_ids;
  const HostTensor* target = nullptr;
  std::unique_ptr<TransferCall> call;
  grpc::Status cancel;  // kCancelled: what CancelTransfer answered
  bool cancel_sent = false;
  TransferResult result;
};

bool Accepted(const TransferResult& r) {
  return !r.events.empty() && r.events.front().has_accepted();
}

bool Completed(const TransferResult& r) {
  return r.status.ok() && Accepted(r) && r.events.back().has_completed();
}

// The stream ended as the API promises: `completed`, or an error with a reason
// (after `accepted`, a last `failed` event saying the same), and no `completed`
// event on a failed stream.
::testing::AssertionResult EndedWell(const Launched& t) {
  const TransferResult& r = t.result;
  if (r.status.ok()) {
    if (Completed(r)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << t.request_id << ": OK without accepted ... completed (" << r.events.size()
           << " events)";
  }
  const std::string reason = client::ReasonOf(r.status);
  if (reason.empty()) {
    return ::testing::AssertionFailure()
           << t.request_id << ": failed without a reason: " << r.status.error_code()
           << " " << r.status.error_message();
  }
  for (const v1::TransferEvent& e : r.events) {
    if (e.has_completed()) {
      return ::testing::AssertionFailure()
             << t.request_id << ": a completed event, then " << reason;
    }
  }
  if (!r.events.empty()) {
    const v1::TransferEvent& last = r.events.back();
    if (!last.has_failed() || last.failed().reason() != reason ||
        last.failed().code() != static_cast<int>(r.status.error_code())) {
      return ::testing::AssertionFailure() << t.request_id << ": ended " << reason
                                           << " after the event " << last.DebugString();
    }
  }
  return ::testing::AssertionSuccess();
}

class StressTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartNodes(kSlowFlags));
    absl::StatusOr<HostTensor> source = RegisterTensor(
        *a_, "src", MakeLayout(1, kSourceBlocks, kBlockBytes), kSourceSeed);
    ASSERT_TRUE(source.ok()) << source.status();
    source_ = *std::move(source);
    // What the source holds, computed apart from its memory.
    pattern_.resize(source_.buffer->bytes());
    client::FillPattern(pattern_, kSourceSeed);
  }

  // Registers `count` target tensors on node-b, named <prefix><i>.
  void RegisterTargets(const std::string& prefix, int count,
                       std::vector<std::unique_ptr<HostTensor>>* out) {
    for (int i = 0; i < count; ++i) {
      absl::StatusOr<HostTensor> t =
          RegisterTensor(*b_, absl::StrCat(prefix, i),
                         MakeLayout(1, kTargetBlocks, kBlockBytes), 100 + out->size());
      ASSERT_TRUE(t.ok()) << t.status();
      out->push_back(std::make_unique<HostTensor>(*std::move(t)));
    }
  }

  // Starts a transfer of kTargetBlocks source blocks (a different spread for each
  // `seed`) into every block of `target`.
  std::unique_ptr<Launched> Launch(const std::string& request_id, Kind kind,
                                   const HostTensor& target, uint32_t seed) {
    auto t = std::make_unique<Launched>();
    t->request_id = request_id;
    t->kind = kind;
    t->target = &target;
    std::vector<uint32_t> target_ids;
    for (uint32_t j = 0; j < kTargetBlocks; ++j) {
      t->source_ids.push_back((seed * 11 + j * 7) % kSourceBlocks);
      target_ids.push_back(j);
    }
    v1::TransferRequest request =
        MakeRequest(request_id, "src", t->source_ids, target.name, target_ids);
    if (kind == Kind::kShortDeadline) {
      const absl::Time deadline = absl::Now() + absl::Milliseconds(5 + (seed % 8) * 15);
      const int64_t seconds = absl::ToUnixSeconds(deadline);
      request.mutable_deadline()->set_seconds(seconds);
      request.mutable_deadline()->set_nanos(static_cast<int32_t>(
          (deadline - absl::FromUnixSeconds(seconds)) / absl::Nanoseconds(1)));
    }
    t->call = std::make_unique<TransferCall>(a_->stub(), request, kStressCallTimeout);
    return t;
  }

  // Waits for `t` to be accepted, then cancels it by request id.
  static void CancelOnceAccepted(AgentProcess& agent, Launched* t) {
    const bool accepted = t->call->WaitForEvent(
        [](const v1::TransferEvent& e) { return e.has_accepted(); });
    if (!accepted) return;  // refused, or ended before the cancel could come
    v1::CancelTransferRequest cancel;
    cancel.set_request_id(t->request_id);
    v1::TransferStatus status;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    t->cancel = agent.stub().CancelTransfer(&context, cancel, &status);
    t->cancel_sent = true;
  }

  // Collects every call's end and checks what the header promises of each; prints
  // how a batch ended.
  void FinishAndCheck(std::vector<std::unique_ptr<Launched>>& launched,
                      absl::Time started, int* completed) {
    std::map<std::string, int> outcomes;
    for (auto& t : launched) {
      t->result = t->call->Finish();
      ++outcomes[t->result.status.ok()
                     ? "completed"
                     : absl::StrCat(t->result.status.error_code(), "/",
                                    client::ReasonOf(t->result.status))];
    }
    std::string line;
    for (const auto& [outcome, count] : outcomes) {
      absl::StrAppend(&line, " ", outcome, " x", count);
    }
    if (launched.size() > 1) {
      std::printf("stress: %zu calls in %s:%s\n", launched.size(),
                  absl::FormatDuration(absl::Now() - started).c_str(), line.c_str());
    }
    for (auto& t : launched) {
      SCOPED_TRACE(t->request_id);
      EXPECT_LT(t->result.ended - started, kStressCallTimeout - absl::Seconds(5))
          << "the call barely ended before its deadline";
      EXPECT_TRUE(EndedWell(*t));
      if (t->cancel_sent) {
        // A cancel answered OK stops the transfer; one answered otherwise found it
        // finished (FAILED_PRECONDITION), each with a reason.
        if (t->cancel.ok()) {
          EXPECT_TRUE(
              HasError(t->result.status, grpc::StatusCode::CANCELLED, "CANCELLED"));
        } else {
          EXPECT_FALSE(client::ReasonOf(t->cancel).empty()) << t->cancel.error_message();
        }
      }
      if (t->kind == Kind::kShortDeadline && !t->result.status.ok() &&
          t->result.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        EXPECT_EQ(client::ReasonOf(t->result.status), "DEADLINE");
      }
      if (!Completed(t->result)) continue;
      ++*completed;
      EXPECT_TRUE(HoldsItsSource(*t));
      EXPECT_TRUE(SaysCompleted(t->request_id));
    }
  }

  // The target tensor holds exactly the source blocks the transfer named.
  ::testing::AssertionResult HoldsItsSource(const Launched& t) const {
    for (uint32_t j = 0; j < kTargetBlocks; ++j) {
      const uint8_t* want = pattern_.data() + t.source_ids[j] * kBlockBytes;
      if (std::memcmp(t.target->Block(0, j).data(), want, kBlockBytes) != 0) {
        return ::testing::AssertionFailure()
               << t.request_id << " completed, but block " << j << " of "
               << t.target->name << " is not source block " << t.source_ids[j];
      }
    }
    return ::testing::AssertionSuccess();
  }

  ::testing::AssertionResult SaysCompleted(const std::string& request_id) {
    v1::GetTransferRequest get;
    get.set_request_id(request_id);
    v1::TransferStatus status;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    grpc::Status s = a_->stub().GetTransfer(&context, get, &status);
    if (!s.ok()) {
      return ::testing::AssertionFailure() << "GetTransfer " << request_id << ": "
                                           << s.error_code() << " " << s.error_message();
    }
    if (status.state() != v1::TRANSFER_STATE_COMPLETED) {
      return ::testing::AssertionFailure()
             << "the stream said completed, GetTransfer says " << status.DebugString();
    }
    return ::testing::AssertionSuccess();
  }

  HostTensor source_;
  std::vector<uint8_t> pattern_;
};

TEST_F(StressTest, ConcurrentCancelledAndShortLivedTransfers) {
  std::vector<std::unique_ptr<HostTensor>> targets;
  ASSERT_NO_FATAL_FAILURE(RegisterTargets("t", kConcurrent, &targets));
  const absl::Time started = absl::Now();
  std::vector<std::unique_ptr<Launched>> launched;
  std::vector<std::thread> cancellers;
  for (int i = 0; i < kConcurrent; ++i) {
    const Kind kind = i % 3 == 1   ? Kind::kCancelled
                      : i % 3 == 2 ? Kind::kShortDeadline
                                   : Kind::kPlain;
    launched.push_back(Launch(absl::StrCat("c-", i), kind, *targets[i], i));
    if (kind == Kind::kCancelled) {
      cancellers.emplace_back(&StressTest::CancelOnceAccepted, std::ref(*a_),
                              launched.back().get());
    }
  }
  for (std::thread& t : cancellers) t.join();
  int completed = 0;
  FinishAndCheck(launched, started, &completed);
  // Nothing cancels a plain transfer or cuts its deadline: once accepted, it
  // completes. (Some are refused: TOO_MANY_TRANSFERS, past --max_transfers.)
  for (const auto& t : launched) {
    if (t->kind == Kind::kPlain && Accepted(t->result)) {
      EXPECT_TRUE(Completed(t->result))
          << t->request_id << ": " << t->result.status.error_message();
    }
  }
  EXPECT_GT(completed, 0);
  EXPECT_TRUE(Serves(*a_));
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(StressTest, TargetRestartedUnderLoad) {
  std::vector<std::unique_ptr<HostTensor>> before;
  ASSERT_NO_FATAL_FAILURE(RegisterTargets("t", kMaxTransfers / 2, &before));
  const absl::Time started = absl::Now();
  std::vector<std::unique_ptr<Launched>> launched;
  for (size_t i = 0; i < before.size(); ++i) {
    launched.push_back(Launch(absl::StrCat("k-", i), Kind::kPlain, *before[i], i));
  }
  // node-b stops dead once the first is accepted (the others are on their way), then
  // is killed, and comes back at the same address.
  ASSERT_TRUE(launched.front()->call->WaitForEvent(
      [](const v1::TransferEvent& e) { return e.has_accepted(); }));
  b_->Pause();
  const std::string address = b_->grpc_address();
  b_->Kill();
  int completed_before = 0;
  FinishAndCheck(launched, started, &completed_before);
  // The kill caught some in flight: they failed, with reasons (checked above).
  EXPECT_LT(completed_before, static_cast<int>(launched.size()));
  retired_logs_.push_back(b_->Log());
  b_.reset();
  absl::StatusOr<std::unique_ptr<AgentProcess>> b =
      AgentProcess::Start(dir_.path(), kNodeB, {absl::StrCat("--listen=", address)});
  ASSERT_TRUE(b.ok()) << b.status();
  b_ = *std::move(b);

  // New targets; each transfer is tried, with a fresh request id each time, until
  // node-a has the session back (its first tries may find the peer unreachable).
  std::vector<std::unique_ptr<HostTensor>> after;
  ASSERT_NO_FATAL_FAILURE(RegisterTargets("t", kMaxTransfers / 2, &after));
  const absl::Time give_up = absl::Now() + kWaitTimeout;
  std::vector<std::unique_ptr<Launched>> last_tries;
  int completed_after = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    for (int attempt = 0;; ++attempt) {
      std::vector<std::unique_ptr<Launched>> one;
      one.push_back(
          Launch(absl::StrCat("r-", i, "-", attempt), Kind::kPlain, *after[i], 50 + i));
      int completed = 0;
      FinishAndCheck(one, absl::Now(), &completed);
      completed_after += completed;
      if (completed > 0 || absl::Now() > give_up) {
        EXPECT_EQ(completed, 1)
            << "transfer " << i << " did not complete after the restart";
        break;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  }
  EXPECT_EQ(completed_after, static_cast<int>(after.size()));
  EXPECT_TRUE(Serves(*a_));
  EXPECT_TRUE(Serves(*b_));
}

}  // namespace
}  // namespace fuselink::testing
