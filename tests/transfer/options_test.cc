// The transfer part's options against their own limits: the defaults validate; each
// field out of range is INVALID_ARGUMENT naming it; a pool given such options aborts.
#include "agent/common/options.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "agent/common/limits.h"
#include "agent/transfer/engine.h"
#include "agent/transfer/landing.h"
#include "agent/transfer/worker_pool.h"
#include "gtest/gtest.h"

namespace fuselink::transfer {
namespace {

// One change to the defaults and the field it puts out of range.
template <typename Options>
struct Bad {
  std::string field;
  std::function<void(Options&)> change;
};

template <typename Options>
void ExpectEachRefused(const std::vector<Bad<Options>>& cases) {
  for (const Bad<Options>& bad : cases) {
    Options o;
    bad.change(o);
    const absl::Status s = o.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.field << ": " << s;
    EXPECT_EQ(FieldOf(s), bad.field) << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), bad.field)) << s;
  }
}

TEST(OptionsTest, DefaultsValidate) {
  EXPECT_TRUE(EngineOptions{}.Validate().ok()) << EngineOptions{}.Validate();
  EXPECT_TRUE(LandingOptions{}.Validate().ok()) << LandingOptions{}.Validate();
  EXPECT_TRUE(KeyedPoolOptions{}.Validate().ok()) << KeyedPoolOptions{}.Validate();
}

TEST(OptionsTest, EngineOptionsOutOfRange) {
  ExpectEachRefused<EngineOptions>({
      {"chunk_bytes", [](EngineOptions& o) { o.chunk_bytes = kMinChunkBytes - 1; }},
      {"chunk_bytes", [](EngineOptions& o) { o.chunk_bytes = kMaxChunkBytes + 1; }},
      {"window_chunks", [](EngineOptions& o) { o.window_chunks = 0; }},
      {"window_chunks", [](EngineOptions& o) { o.window_chunks = kMaxWindowChunks + 1; }},
      {"max_active_transfers", [](EngineOptions& o) { o.max_active_transfers = 0; }},
      {"max_active_transfers_per_requester",
       [](EngineOptions& o) { o.max_active_transfers_per_requester = 0; }},
      {"prepare_threads", [](EngineOptions& o) { o.prepare_threads = 0; }},
      {"prepare_threads",
       [](EngineOptions& o) { o.prepare_threads = kMaxPoolThreads + 1; }},
      {"prepare_threads_per_target",
       [](EngineOptions& o) { o.prepare_threads_per_target = o.prepare_threads + 1; }},
      {"prepare_queue_per_target",
       [](EngineOptions& o) {
         o.prepare_queue_per_target = o.prepare_threads_per_target - 1;
       }},
      {"drain_bound", [](EngineOptions& o) { o.drain_bound = absl::ZeroDuration(); }},
      {"drain_bound",
       [](EngineOptions& o) { o.drain_bound = absl::Milliseconds(kMaxTimeoutMs + 1); }},
  });
  // The bounds themselves are in range; a share past the whole is allowed.
  EngineOptions o;
  o.window_chunks = kMaxWindowChunks;
  o.prepare_queue_per_target = o.prepare_threads_per_target;
  o.max_active_transfers_per_requester = o.max_active_transfers + 1;
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
}

TEST(OptionsTest, LandingOptionsOutOfRange) {
  ExpectEachRefused<LandingOptions>({
      {"idle_timeout",
       [](LandingOptions& o) {
         o.idle_timeout = kMinIdleTimeout - absl::Milliseconds(1);
       }},
      {"idle_timeout", [](LandingOptions& o) { o.idle_timeout = absl::Hours(2); }},
      {"max_per_source", [](LandingOptions& o) { o.max_per_source = 0; }},
      {"max_per_source", [](LandingOptions& o) { o.max_per_source = kMaxIncoming + 1; }},
  });
}

TEST(OptionsTest, KeyedPoolOptionsOutOfRange) {
  ExpectEachRefused<KeyedPoolOptions>({
      {"threads", [](KeyedPoolOptions& o) { o.threads = 0; }},
      {"threads", [](KeyedPoolOptions& o) { o.threads = kMaxPoolThreads + 1; }},
      {"running_per_key", [](KeyedPoolOptions& o) { o.running_per_key = 0; }},
      {"running_per_key", [](KeyedPoolOptions& o) { o.running_per_key = o.threads + 1; }},
      {"pending_per_key", [](KeyedPoolOptions& o) { o.pending_per_key = 0; }},
      {"pending_total",
       [](KeyedPoolOptions& o) { o.pending_total = o.pending_per_key - 1; }},
  });
  // Fewer pending than running is a lane that runs fewer: allowed.
  KeyedPoolOptions o;
  o.threads = 4;
  o.running_per_key = 4;
  o.pending_per_key = 1;
  EXPECT_TRUE(o.Validate().ok()) << o.Validate();
}

// Once clamped into range; now a caller that skipped Validate is stopped.
TEST(OptionsDeathTest, KeyedPoolRefusesOptionsOutOfRange) {
  KeyedPoolOptions o;
  o.running_per_key = o.threads + 1;
  EXPECT_DEATH(KeyedPool pool(o), "running_per_key must be 1 to 2, not 3");
}

}  // namespace
}  // namespace fuselink::transfer
