// Writes through the verbs fabric that cannot land, on real RDMA devices: refusals
// (outside a window, another peer's, a closed or unknown key) place nothing; a late
// write meets b's NIC and the QP is renewed; the peer going during a renewal; a close
// racing writes on the wire; a rail going down. Each write completes exactly once, and
// the refusal tests compare every byte of b's memory with what it should hold. The
// fixture is in verbs_fabric_test_util.h.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/verbs/fabric.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"
#include "tests/rdma/verbs_fabric_test_util.h"

namespace fuselink::fabric {
namespace {

using testing::DrainCounter;
using testing::kUntouched;
using testing::ManyBytes;
using testing::Rail;
using testing::Rails;
using testing::RandomBytes;
using testing::VerbsFabricTest;
using Clock = std::chrono::steady_clock;

// Checks a refused write's completion: the code, the reason, the refusal.
void ExpectRefused(const std::optional<Completion>& c, Refusal refusal,
                   absl::string_view what) {
  ASSERT_TRUE(c.has_value()) << what;
  const absl::Status expected = RefusalStatus(refusal);
  EXPECT_EQ(c->refusal, refusal) << what << ": " << c->status;
  EXPECT_EQ(c->status.code(), expected.code()) << what << ": " << c->status;
  EXPECT_EQ(ReasonOf(c->status), ReasonOf(expected)) << what << ": " << c->status;
  std::printf("refusal: %s -> %s\n", std::string(what).c_str(),
              c->status.ToString().c_str());
}

// b's memory: 4 windows' worth of 64 KiB blocks. W1 is a's: blocks 0 and 2; W2 is
// another peer's ("c"): block 1; W3, a's, opened after W1 closes: block 3.
TEST_F(VerbsFabricTest, RefusalsPlaceNothingAndTheFabricGoesOn) {
  FL_MAKE(2, 2);
  constexpr uint64_t kBlock = 64 << 10;
  std::vector<uint8_t> source = RandomBytes(kBlock, 3);
  std::vector<uint8_t> target(4 * kBlock, kUntouched);
  std::vector<uint8_t> expected = target;  // what b's memory must hold
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  const WindowKey w1 = Window(target_key, "a", {{0, kBlock}, {2 * kBlock, kBlock}});
  const WindowKey w2 = Window(target_key, "c", {{kBlock, kBlock}});
  ASSERT_NE(w1, 0u);
  ASSERT_NE(w2, 0u);
  uint64_t wr_id = 1;
  auto write = [&](int nic, WindowKey key, uint64_t offset, uint32_t bytes) {
    const uint64_t id = wr_id++;
    absl::Status posted = Post(nic, {.local_key = source_key,
                                     .remote_key = key,
                                     .remote_offset = offset,
                                     .bytes = bytes,
                                     .imm = static_cast<uint32_t>(id),
                                     .wr_id = id});
    EXPECT_TRUE(posted.ok()) << posted;
    return CompletionOf(id);
  };
  auto lands = [&](int nic, WindowKey key, uint64_t offset, uint32_t bytes) {
    std::optional<Completion> c = write(nic, key, offset, bytes);
    ASSERT_TRUE(c.has_value());
    EXPECT_TRUE(c->status.ok()) << c->status;
    EXPECT_EQ(c->refusal, Refusal::kNone);
    std::copy(source.begin(), source.begin() + bytes, expected.begin() + offset);
  };
  auto unchanged = [&](absl::string_view after) {
    for (size_t i = 0; i < target.size(); ++i) {
      ASSERT_EQ(target[i], expected[i]) << "byte " << i << " after " << after;
    }
  };

  // Inside W1, on both NICs (each write goes to the next QP of its NIC).
  for (int i = 0; i < 4; ++i) lands(i % 2, w1, (i < 2 ? 0 : 2 * kBlock) + i * 4096, 4096);
  unchanged("writes inside W1");
  // A write completes at a when b's NIC acknowledges it; b's poller reports the arrival
  // on its own thread, maybe later. A window closed in between drops that report (no
  // arrival is delivered through a closing window), so wait for it before any close.
  ASSERT_TRUE(b_events_.WaitForArrivals(4));
  // Outside W1's extents: in the gap (W2's block), and across the end of extent 0.
  ExpectRefused(write(0, w1, kBlock, 4096), Refusal::kOutsideWindow, "W1, in its gap");
  ExpectRefused(write(1, w1, kBlock - 2048, 4096), Refusal::kOutsideWindow,
                "W1, across an extent's end");
  ExpectRefused(write(0, w1, 4 * kBlock, 16), Refusal::kOutsideWindow,
                "W1, past the region");
  unchanged("writes outside W1");
  // Into another peer's window.
  ExpectRefused(write(0, w2, kBlock, 4096), Refusal::kNotYourWindow, "c's W2");
  unchanged("a write into c's window");
  // A key b never handed out.
  WindowKey stale = w1 ^ 0x5A5A5A5Au;
  if (stale == w2 || stale == 0) stale ^= 1;
  ExpectRefused(write(1, stale, 0, 4096), Refusal::kNoWindow, "a key never opened");
  unchanged("a write with a stale key");
  // W1 closes: drained runs once; a late write and its duplicate place nothing.
  DrainCounter drained;
  b_->CloseWindow(w1, drained.Callback());
  EXPECT_EQ(drained.WaitFor(1), 1);
  ExpectRefused(write(0, w1, 4096, 4096), Refusal::kNoWindow, "W1 after its close");
  ExpectRefused(write(0, w1, 4096, 4096), Refusal::kNoWindow, "the same write again");
  ExpectRefused(write(1, w1, 2 * kBlock, 4096), Refusal::kNoWindow,
                "W1 after its close, NIC 1");
  unchanged("late writes into W1");
  // The fabric goes on: W3 takes writes on both NICs and every QP.
  const WindowKey w3 = Window(target_key, "a", {{3 * kBlock, kBlock}});
  for (int i = 0; i < 8; ++i) lands(i % 2, w3, 3 * kBlock + i * 4096, 4096);
  unchanged("writes inside W3");
  ASSERT_TRUE(b_events_.WaitForArrivals(12));
  b_->CloseWindow(w3, drained.Callback());
  b_->CloseWindow(w2, drained.Callback());
  EXPECT_EQ(drained.WaitFor(3), 3);
  b_->CloseWindow(w3, drained.Callback());  // unknown by now: drained at once
  EXPECT_EQ(drained.WaitFor(4), 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(drained.WaitFor(4), 4) << "a drained ran twice";
  // Only the 12 writes that landed arrived, each from "a".
  EXPECT_EQ(b_events_.arrivals().size(), 12u);
  for (const std::string& name : b_events_.names()) EXPECT_EQ(name, "a");
  uint64_t refused = 0;
  for (int nic = 0; nic < 2; ++nic) refused += b_->counters(nic).refused_writes;
  std::printf("refusal: b counted %llu refused writes\n",
              static_cast<unsigned long long>(refused));
  EXPECT_GE(refused, 5u);  // the 5 queried before the close, at least
  EXPECT_TRUE(a_events_.peers_lost().empty());
}

// A late write that the source still has the rkey for: b does not tell a of closes,
// so the write meets b's NIC. It completes NOT_FOUND WINDOW_CLOSED; the writes queued
// behind it on the same QP are posted again on the renewed QP and land.
class VerbsLateWriteTest : public VerbsFabricTest,
                           public ::testing::WithParamInterface<int> {};

TEST_P(VerbsLateWriteTest, MeetsTheNicAndTheQpIsRenewed) {
  const int qps = GetParam();
  FL_MAKE(1, qps, [](VerbsFabricOptions& b) { b.push_window_closes = false; });
  constexpr uint64_t kBlock = 256 << 10;
  std::vector<uint8_t> source = RandomBytes(kBlock, 9);
  std::vector<uint8_t> target(2 * kBlock, kUntouched);
  std::vector<uint8_t> expected = target;
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  for (int round = 0; round < 2; ++round) {
    const WindowKey old_window = Window(target_key, "a", {{0, kBlock}});
    const WindowKey window = Window(target_key, "a", {{kBlock, kBlock}});
    DrainCounter drained;
    b_->CloseWindow(old_window, drained.Callback());
    ASSERT_EQ(drained.WaitFor(1), 1);
    const uint64_t base = 1000 * (round + 1);
    // The late write, then 16 writes into the open window on the same NIC (with one
    // QP: on the same QP, right behind it; with two: half of them).
    ASSERT_TRUE(Post(0, {.local_key = source_key,
                         .remote_key = old_window,
                         .remote_offset = 0,
                         .bytes = 16 << 10,
                         .imm = 1,
                         .wr_id = base})
                    .ok());
    constexpr int kBehind = 16;
    for (int i = 0; i < kBehind; ++i) {
      const uint64_t offset = kBlock + i * (16 << 10);
      ASSERT_TRUE(Post(0, {.local_key = source_key,
                           .local_offset = uint64_t(i) * (16 << 10),
                           .remote_key = window,
                           .remote_offset = offset,
                           .bytes = 16 << 10,
                           .imm = 2,
                           .wr_id = base + 1 + i})
                      .ok());
      std::copy(source.begin() + i * (16 << 10), source.begin() + (i + 1) * (16 << 10),
                expected.begin() + offset);
    }
    const auto started = Clock::now();
    ExpectRefused(CompletionOf(base), Refusal::kNoWindow, "a write meeting b's NIC late");
    for (int i = 0; i < kBehind; ++i) {
      std::optional<Completion> c = CompletionOf(base + 1 + i);
      ASSERT_TRUE(c.has_value());
      EXPECT_TRUE(c->status.ok()) << "write " << i << " behind it: " << c->status;
    }
    std::printf(
        "bench: late write with %d QPs: refusal and %d writes behind it in %.1f ms\n",
        qps, kBehind,
        std::chrono::duration<double, std::milli>(Clock::now() - started).count());
    for (size_t i = 0; i < target.size(); ++i) {
      ASSERT_EQ(target[i], expected[i]) << "byte " << i << ", round " << round;
    }
    b_->CloseWindow(window, drained.Callback());
    ASSERT_EQ(drained.WaitFor(2), 2);
    std::fill(target.begin(), target.end(), kUntouched);
    expected = target;
  }
  // Two rounds: two refusals, both by b's NIC (a counted them from its CQ; b answered
  // no QUERY, which is how a source learns of a refusal it decided itself).
  EXPECT_EQ(a_->counters(0).refused_writes, 2u);
  EXPECT_EQ(b_->counters(0).refused_writes, 0u);
  // Every QP still carries writes.
  const WindowKey window = Window(target_key, "a", {{0, 2 * kBlock}});
  for (int i = 0; i < 2 * qps; ++i) {
    ASSERT_TRUE(Post(0, {.local_key = source_key,
                         .remote_key = window,
                         .remote_offset = uint64_t(i) * 4096,
                         .bytes = 4096,
                         .wr_id = 5000u + i})
                    .ok());
  }
  for (int i = 0; i < 2 * qps; ++i) {
    std::optional<Completion> c = CompletionOf(5000u + i);
    ASSERT_TRUE(c.has_value());
    EXPECT_TRUE(c->status.ok()) << c->status;
  }
  EXPECT_TRUE(a_events_.peers_lost().empty());
  EXPECT_TRUE(b_events_.peers_lost().empty());
}

INSTANTIATE_TEST_SUITE_P(Qps, VerbsLateWriteTest, ::testing::Values(1, 2));

// The target goes away while the source renews the QP a late write broke: every write
// still completes exactly once — the late one refused (or UNAVAILABLE if the QP died
// first), the ones held behind it OK or UNAVAILABLE, nothing else — and a loses b.
TEST_F(VerbsFabricTest, ARenewalCutOffByThePeersGoingFailsItsWritesOnce) {
  FL_MAKE(1, 1, [](VerbsFabricOptions& b) { b.push_window_closes = false; });
  constexpr uint32_t kWrite = 64 << 10;
  std::vector<uint8_t> source = RandomBytes(kWrite, 13);
  std::vector<uint8_t> target(2 * kWrite, kUntouched);
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  const WindowKey old_window = Window(target_key, "a", {{0, kWrite}});
  const WindowKey window = Window(target_key, "a", {{kWrite, kWrite}});
  DrainCounter drained;
  b_->CloseWindow(old_window, drained.Callback());
  ASSERT_EQ(drained.WaitFor(1), 1);
  constexpr int kBehind = 32;
  ASSERT_TRUE(Post(0, {.local_key = source_key,
                       .remote_key = old_window,
                       .bytes = kWrite,
                       .wr_id = 0})
                  .ok());
  for (int i = 1; i <= kBehind; ++i) {
    ASSERT_TRUE(Post(0, {.local_key = source_key,
                         .remote_key = window,
                         .remote_offset = kWrite,
                         .bytes = kWrite,
                         .wr_id = uint64_t(i)})
                    .ok());
  }
  b_.reset();  // while the refusal and the renewal are under way
  ASSERT_TRUE(a_events_.WaitForCompletions(kBehind + 1));
  ASSERT_TRUE(a_events_.WaitForPeersLost(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // no late duplicates
  std::map<uint64_t, int> seen;
  int ok = 0, unavailable = 0;
  for (const Completion& c : a_events_.completions()) {
    ++seen[c.wr_id];
    if (c.wr_id == 0) {
      EXPECT_TRUE(c.refusal == Refusal::kNoWindow ||
                  c.status.code() == absl::StatusCode::kUnavailable)
          << c.status;
      continue;
    }
    if (c.status.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(c.status.code(), absl::StatusCode::kUnavailable) << c.status;
      ++unavailable;
    }
  }
  EXPECT_EQ(seen.size(), size_t{kBehind + 1});
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << "wr_id " << id;
  std::printf("cut-off renewal: late write: %s; behind it %d OK, %d UNAVAILABLE\n",
              a_events_.completions().empty()
                  ? "-"
                  : [&] {
                      for (const Completion& c : a_events_.completions()) {
                        if (c.wr_id == 0) return c.status.ToString();
                      }
                      return std::string("?");
                    }()
                          .c_str(),
              ok, unavailable);
}

// A window closed while writes into it are on the wire: each completes OK (all of it
// landed) or NOT_FOUND WINDOW_CLOSED, never UNAVAILABLE; once `drained` has run,
// nothing in b's memory changes any more, and every OK write is in it.
TEST_F(VerbsFabricTest, NothingLandsOnceDrainedHasRun) {
  FL_MAKE(1, 2);
  constexpr uint32_t kWrite = 1 << 20;
  constexpr int kWrites = 48;  // 48 MiB: about a second on rxe under TCG
  std::vector<uint8_t> source = ManyBytes(size_t{kWrites} * kWrite, 12);
  std::vector<uint8_t> target(source.size(), kUntouched);
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  const WindowKey window = Window(target_key, "a", {{0, target.size()}});
  absl::Mutex mu;
  std::vector<uint8_t> at_drained;
  int drained_runs = 0;
  Clock::time_point drained_at;
  const auto started = Clock::now();
  for (int i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(Post(0, {.local_key = source_key,
                         .local_offset = uint64_t(i) * kWrite,
                         .remote_key = window,
                         .remote_offset = uint64_t(i) * kWrite,
                         .bytes = kWrite,
                         .wr_id = uint64_t(i)})
                    .ok());
  }
  // Once the first write has arrived: the others are on the wire or queued.
  ASSERT_TRUE(b_events_.WaitForArrivals(1));
  const auto closing = Clock::now();
  b_->CloseWindow(window, [&] {
    absl::MutexLock lock(&mu);
    at_drained = target;  // what b's memory holds once drained
    drained_at = Clock::now();
    ++drained_runs;
  });
  ASSERT_TRUE(a_events_.WaitForCompletions(kWrites));
  const auto completed = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int ok = 0, refused = 0;
  absl::MutexLock lock(&mu);
  ASSERT_EQ(drained_runs, 1);
  EXPECT_EQ(target, at_drained) << "bytes landed after drained ran";
  for (int i = 0; i < kWrites; ++i) {
    std::optional<Completion> c = CompletionOf(uint64_t(i));
    ASSERT_TRUE(c.has_value());
    if (c->status.ok()) {
      ++ok;
      EXPECT_TRUE(std::equal(source.begin() + size_t(i) * kWrite,
                             source.begin() + size_t(i + 1) * kWrite,
                             at_drained.begin() + size_t(i) * kWrite))
          << "write " << i << " completed OK but is not all there";
    } else {
      ++refused;
      EXPECT_EQ(c->refusal, Refusal::kNoWindow) << i << ": " << c->status;
    }
  }
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf(
      "drained: %d writes landed, %d refused by the close; close at %.1f ms, "
      "drained %.1f ms later, all complete at %.1f ms\n",
      ok, refused, ms(closing - started), ms(drained_at - closing),
      ms(completed - started));
  EXPECT_EQ(ok + refused, kWrites);
  EXPECT_GT(refused, 0) << "the close came after the last write: it proved nothing";
}

TEST_F(VerbsFabricTest, RailDownFailsItsWritesUnavailableExactlyOnce) {
  FL_MAKE(2, 2);
  const Rail rail = Rails()[1];
  if (rail.a_veth.empty()) GTEST_SKIP() << "FUSELINK_RDMA_VETHS is not set";
  constexpr size_t kChunk = 64 << 10;
  // The rail goes down once it has carried kCarried writes, while the writer keeps
  // NIC 1's queue full until its posts fail: writes are in flight at the down however
  // fast the link is (a fixed count on a timer was all done first on a fast one).
  constexpr size_t kCarried = 32;
  constexpr int kMaxWrites = 1 << 16;  // bound on wr_ids; 20 s end the loop first
  std::vector<uint8_t> source = RandomBytes(kChunk, 5);
  std::vector<uint8_t> target(kChunk * 2, kUntouched);
  const RegionKey source_key = Region(*a_, source);
  const RegionKey target_key = Region(*b_, target);
  const WindowKey window = Window(target_key, "a", {{0, 2 * kChunk}});
  int posted = 0;
  const auto started = Clock::now();
  std::thread downer([&] {
    while (a_events_.completions().size() < kCarried &&
           Clock::now() - started < std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::system(absl::StrCat("ip link set ", rail.a_veth, " down").c_str());
  });
  while (posted < kMaxWrites && Clock::now() - started < std::chrono::seconds(20)) {
    WriteOp op{.local_key = source_key,
               .remote_key = window,
               .remote_offset = (posted % 2) * kChunk,
               .bytes = kChunk,
               .imm = 7,
               .wr_id = static_cast<uint64_t>(posted)};
    absl::Status status = a_->PostWrite(b_on_a_, 1, op);
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    if (!status.ok()) break;  // UNAVAILABLE: the rail is gone
    ++posted;
  }
  downer.join();
  ASSERT_TRUE(a_events_.WaitForCompletions(posted));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // no late duplicates
  std::map<uint64_t, int> seen;
  int ok = 0, unavailable = 0, other = 0;
  for (const Completion& c : a_events_.completions()) {
    ++seen[c.wr_id];
    if (c.status.ok()) {
      ++ok;
    } else if (c.status.code() == absl::StatusCode::kUnavailable) {
      ++unavailable;
    } else {
      ++other;
    }
  }
  std::printf("rail down: posted %d, completed OK %d, UNAVAILABLE %d, other %d; first "
              "failure: %s\n",
              posted, ok, unavailable, other,
              unavailable > 0 ? [&] {
                for (const Completion& c : a_events_.completions()) {
                  if (!c.status.ok()) return c.status.ToString();
                }
                return std::string();
              }().c_str() : "none");
  EXPECT_EQ(static_cast<int>(seen.size()), posted);
  for (const auto& [id, count] : seen) EXPECT_EQ(count, 1) << "wr_id " << id;
  EXPECT_GT(unavailable, 0);
  EXPECT_EQ(other, 0);
  // Rail 0 still works.
  WriteOp op{.local_key = source_key,
             .remote_key = window,
             .bytes = 4096,
             .imm = 8,
             .wr_id = 100000};
  absl::Status status = a_->PostWrite(b_on_a_, 0, op);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(a_->PostWrite(b_on_a_, 1, op).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(a_events_.WaitForCompletions(posted + 1));
  EXPECT_TRUE(a_events_.completions().back().status.ok());
  std::system(absl::StrCat("ip link set ", rail.a_veth, " up").c_str());
  std::system(absl::StrCat("ip link set ", rail.b_veth, " up").c_str());
  std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace
}  // namespace fuselink::fabric
