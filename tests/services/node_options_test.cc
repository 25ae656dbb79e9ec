// NodeOptions::Validate: the defaults validate; a field of the node out of its range,
// or of a part the node holds, is INVALID_ARGUMENT naming it by its path.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "agent/common/limits.h"
#include "agent/common/options.h"
#include "agent/node/node.h"
#include "gtest/gtest.h"

namespace fuselink::services {
namespace {

struct Bad {
  std::string field;
  std::function<void(NodeOptions&)> change;
};

TEST(NodeOptionsTest, DefaultsValidate) {
  EXPECT_TRUE(NodeOptions{}.Validate().ok()) << NodeOptions{}.Validate();
  EXPECT_TRUE(sched::Limits{}.Validate().ok());
  EXPECT_TRUE(nicstat::ForeignOptions{}.Validate().ok());
  EXPECT_TRUE(memory::OwnerShares{}.Validate().ok());
}

TEST(NodeOptionsTest, EachFieldOutOfRangeIsNamedByItsPath) {
  const std::vector<Bad> cases = {
      {"fabric_stall_timeout_ms", [](NodeOptions& o) { o.fabric_stall_timeout_ms = 0; }},
      {"fabric_ack_timeout_ms",
       [](NodeOptions& o) { o.fabric_ack_timeout_ms = kMaxTimeoutMs + 1; }},
      {"rdma_traffic_class", [](NodeOptions& o) { o.rdma_traffic_class = 256; }},
      {"rdma_service_level", [](NodeOptions& o) { o.rdma_service_level = -1; }},
      {"rdma_staging_slots", [](NodeOptions& o) { o.rdma_staging_slots = 0; }},
      {"rdma_staging_slots_per_peer",
       [](NodeOptions& o) { o.rdma_staging_slots_per_peer = o.rdma_staging_slots + 1; }},
      {"rdma_max_shadow_bytes", [](NodeOptions& o) { o.rdma_max_shadow_bytes = 0; }},
      {"rdma_max_shadow_bytes",
       [](NodeOptions& o) { o.rdma_max_shadow_bytes = kMaxShadowBytes + 1; }},
      {"rdma_max_qps_per_nic",
       [](NodeOptions& o) { o.rdma_max_qps_per_nic = o.qps_per_nic - 1; }},
      {"max_watches_per_identity",
       [](NodeOptions& o) { o.max_watches_per_identity = 0; }},
      {"gpu", [](NodeOptions& o) { o.gpu = "on"; }},
      {"gpu_copy_timeout_ms", [](NodeOptions& o) { o.gpu_copy_timeout_ms = 0; }},
      {"foreign_check", [](NodeOptions& o) { o.foreign_check = absl::ZeroDuration(); }},
      {"foreign_check",
       [](NodeOptions& o) {
         o.foreign_check = kMaxForeignCheck + absl::Milliseconds(1);
       }},
      {"ipc_close_wait",
       [](NodeOptions& o) {
         o.ipc_close_wait = kMaxIpcCloseWait + absl::Milliseconds(1);
       }},
      // The parts the node holds, by their path.
      {"limits.direct_depth", [](NodeOptions& o) { o.limits.direct_depth = 0; }},
      {"limits.borrow_depth",
       [](NodeOptions& o) { o.limits.borrow_depth = sched::kMaxDepth + 1; }},
      {"engine.window_chunks", [](NodeOptions& o) { o.engine.window_chunks = 0; }},
      {"landing.max_per_source", [](NodeOptions& o) { o.landing.max_per_source = 0; }},
      {"shares.max_tensors",
       [](NodeOptions& o) { o.shares.max_tensors = memory::kMaxTensors + 1; }},
      {"shares.max_layout_parts", [](NodeOptions& o) { o.shares.max_layout_parts = 0; }},
      {"foreign.busy_bytes_per_s",
       [](NodeOptions& o) { o.foreign.busy_bytes_per_s = -2; }},
      {"foreign.ack_overhead_fraction",
       [](NodeOptions& o) { o.foreign.ack_overhead_fraction = std::nan(""); }},
      {"incoming_prepares.threads",
       [](NodeOptions& o) { o.incoming_prepares.threads = 0; }},
      {"registrations.pending_total",
       [](NodeOptions& o) { o.registrations.pending_total = 1; }},
  };
  for (const Bad& bad : cases) {
    NodeOptions o;
    bad.change(o);
    const absl::Status s = o.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad.field << ": " << s;
    EXPECT_EQ(FieldOf(s), bad.field) << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), bad.field)) << s;
  }
}

// The node refuses such options before it builds anything.
TEST(NodeOptionsTest, CreateRefusesThem) {
  NodeOptions o;
  o.engine.window_chunks = kMaxWindowChunks + 1;
  absl::StatusOr<std::unique_ptr<Node>> node = Node::Create(o, nullptr);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(FieldOf(node.status()), "engine.window_chunks") << node.status();
}

}  // namespace
}  // namespace fuselink::services
