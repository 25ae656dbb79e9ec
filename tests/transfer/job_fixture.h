// The fixture of the job and window tests: one transfer's Job (and its Window) over
// a fake fabric the test drives write by write. No threads and no sleeps: time is the
// test's clock, and each event runs under the job's lock through Do().
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/common/status_macros.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/job.h"
#include "agent/transfer/preparer.h"
#include "agent/transfer/verdict.h"
#include "agent/transfer/wr_id.h"
#include "gtest/gtest.h"
#include "tests/transfer/fakes.h"

namespace fuselink::transfer::testing {

// 2 layers x 4 blocks of 8 KiB; chunks of 4 KiB: one block is 4 chunks.
inline const memory::Layout kLayout{2, 4, 8192, 0, 0};
inline constexpr uint32_t kChunkBytes = 4096;
inline constexpr uint32_t kWindow = 4;

inline ImmOp OpOf(const Posted& p) { return ImmOpOf(p.op.imm); }

class JobTest : public ::testing::Test {
 protected:
  explicit JobTest(sched::Policy policy = sched::Policy::kStatic,
                   sched::Limits limits = {})
      : fabric_(2), registry_(&fabric_), scheduler_(policy, 2, limits) {
    ctx_.fabric = &fabric_;
    ctx_.scheduler = &scheduler_;
    ctx_.lanes = fabric_.nic_count();
    ctx_.options.chunk_bytes = kChunkBytes;
    ctx_.options.window_chunks = kWindow;
    ctx_.options.verdict.notice_wait = absl::Seconds(1);
    ctx_.options.verdict.query_every = absl::Seconds(1);
    ctx_.options.verdict.give_up_after = absl::Seconds(5);
    ctx_.clock = [this] { return now_; };
    fabric_.set_on_completion([this](const fabric::Completion& c) { Deliver(c); });
  }

  // A job moving `blocks` of "src" to the same blocks of node-b, accepted by the
  // target with `idle_mask`.
  void Start(std::vector<uint32_t> blocks = {0},
             absl::Time deadline = absl::InfiniteFuture(), uint32_t idle_mask = 0,
             bool gpu = false) {
    absl::StatusOr<memory::TensorInfo> info =
        gpu ? testing::RegisterGpuTensor(registry_, "src", kLayout, 0)
            : testing::RegisterHostTensor(registry_, "src", kLayout);
    ASSERT_TRUE(info.ok()) << info.status();
    layout_ = info->layout;
    absl::StatusOr<memory::TensorLease> lease = registry_.Acquire("src");
    ASSERT_TRUE(lease.ok());
    request_ = testing::MakeRequest("r1", "src", blocks, "dst", blocks);
    request_.set_layer_by_layer(layer_by_layer_);
    request_.set_lease_ms(lease_ms_);
    auto transfer = std::make_shared<Transfer>(
        "t1", request_, "fp", std::vector<std::string>{"rail0", "rail1"}, deadline);
    job_ = std::make_shared<Job>(7, transfer, *std::move(lease), 0, &ctx_);
    std::optional<IncomingSpec> spec;
    Do([&](Job& j, JobEffects* fx)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { spec = j.BeginPrepare(fx); });
    ASSERT_TRUE(spec.has_value());
    EXPECT_EQ(spec->total_bytes, blocks.size() * kLayout.layers * kLayout.block_bytes);
    if (!prepare_now_) return;
    Accept(testing::MakePrepared(layout_, idle_mask));
  }
  void Accept(const Prepared& prepared) {
    absl::StatusOr<std::vector<Extent>> plan = PlanTransfer(request_, layout_, prepared);
    Do([&](Job& j, JobEffects* fx)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { j.OnPrepared(prepared, plan, fx); });
  }

  // Runs `event` under the job's lock and keeps what it asked for.
  template <typename F>
  JobEffects Do(F&& event) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    JobEffects fx;
    {
      absl::MutexLock lock(&job_->mu());
      event(*job_, &fx);
    }
    Keep(fx);
    return fx;
  }
  void Keep(JobEffects& fx) {
    if (fx.finished) job_->transfer()->ReleaseEnd();  // as the engine does
    finished_ |= fx.finished;
    free_request_id_ |= fx.free_request_id;
    waits_ += fx.wait;
    queries_ += fx.query;
    grow_relay_ |= fx.grow_relay;
    for (const relay::Slot& s : fx.release_after_fence) after_fence_.push_back(s);
    if (fx.outgoing) outgoing_ = fx.outgoing;
  }
  void Deliver(const fabric::Completion& c) {
    const WrId w = DecodeWrId(c.wr_id);
    if (w.job == 0) return;  // a notice nobody follows
    ASSERT_EQ(w.job, 7u);
    Do([&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
      last_known_ = j.OnCompletion(w.entry, w.seq, c, fx);
    });
  }

  void Verdict(Verdict v) {
    Do([&](Job& j, JobEffects* fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) {
      j.OnVerdict(static_cast<uint8_t>(v), fx);
    });
  }
  void Timer() {
    Do([&](Job& j, JobEffects* fx)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { j.OnTimer(fx); });
  }
  void Resume() {
    Do([&](Job& j, JobEffects* fx)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { j.Resume(fx); });
  }
  void Reply(absl::StatusOr<std::optional<absl::Status>> reply) {
    Do([&](Job& j, JobEffects* fx)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(j.mu()) { j.OnVerdictReply(reply, fx); });
  }
  absl::Time timer() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    absl::MutexLock lock(&job_->mu());
    return job_->timer();
  }

  State state() const { return job_->transfer()->state(); }
  v1::TransferStatus status() const { return job_->transfer()->Status(); }
  // The end's code and reason ("" and OK when it completed).
  std::pair<absl::StatusCode, std::string> End() const {
    const v1::TransferStatus s = status();
    return {static_cast<absl::StatusCode>(s.failure().code()), s.failure().reason()};
  }
  // Completes every data write pending, leaving notices alone.
  void LandData() {
    for (int round = 0; round < 100; ++round) {
      std::vector<Posted> data;
      std::vector<Posted> rest;
      for (const Posted& p : fabric_.Take())
        (OpOf(p) == ImmOp::kData ? data : rest).push_back(p);
      for (const Posted& p : rest) Repost(p);
      if (data.empty()) return;
      for (const Posted& p : data) fabric_.Complete(p);
    }
  }
  // Puts a taken write back as pending (the test did not act on it).
  void Repost(const Posted& p) { held_.push_back(p); }
  // The commit posted and not yet completed, taken.
  std::optional<Posted> TakeCommit() {
    std::optional<Posted> commit;
    std::vector<Posted> all = fabric_.Take();
    all.insert(all.end(), held_.begin(), held_.end());
    held_.clear();
    for (const Posted& p : all) {
      if (OpOf(p) == ImmOp::kCommit && !commit) {
        commit = p;
      } else {
        held_.push_back(p);
      }
    }
    return commit;
  }
  int Posts(ImmOp op) const {
    int n = 0;
    for (const Posted& p : fabric_.history()) n += OpOf(p) == op;
    return n;
  }
  // Lands the data and the commit: the target has everything, and has not spoken.
  void Commit() {
    LandData();
    std::optional<Posted> commit = TakeCommit();
    ASSERT_TRUE(commit.has_value());
    fabric_.Complete(*commit);
  }

  FakeFabric fabric_;
  memory::Registry registry_;
  sched::Scheduler scheduler_;
  JobContext ctx_;
  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  memory::Layout layout_;
  v1::TransferRequest request_;
  std::shared_ptr<Job> job_;
  bool prepare_now_ = true;
  std::vector<Posted> held_;
  bool layer_by_layer_ = false;             // Start()s the request layer by layer
  uint32_t lease_ms_ = 0;                   // Start()s the request under this lease
  std::optional<v1::WatchEvent> outgoing_;  // what the outgoing watches heard
  bool finished_ = false;
  bool free_request_id_ = false;
  bool last_known_ = false;
  int waits_ = 0;
  int queries_ = 0;
  uint32_t grow_relay_ = 0;
  std::vector<relay::Slot> after_fence_;
};

}  // namespace fuselink::transfer::testing
