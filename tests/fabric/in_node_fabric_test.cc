// The in-node lane: copies land only inside the node's own open windows, a window
// drains before it is reported closed, refusals place nothing, the queue pushes back,
// GPU memory without a copier fails the write, and everything else reaches the
// wrapped fabric (whose windows never share a key with the lane's).
#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/in_node/fabric.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"

namespace fuselink::fabric {
namespace {

using testing::LoopbackOptions;
using testing::RecordingHandler;

constexpr PeerId kSelf = InNodeFabric::kSelf;

class InNodeFabricTest : public ::testing::Test {
 protected:
  void SetUp() override { Make({}); }

  void Make(InNodeOptions options) {
    fabric_.reset();
    TcpFabricOptions tcp = LoopbackOptions("a", 1, keys_);
    tcp.device_stager = &stager_;  // its "GPU memory" is host memory
    absl::StatusOr<std::unique_ptr<Fabric>> wire = CreateTcpFabric(tcp, &events_);
    ASSERT_TRUE(wire.ok()) << wire.status();
    options.node = "a";
    fabric_ =
        std::make_unique<InNodeFabric>(*std::move(wire), &events_, std::move(options));
  }

  RegionKey Register(std::vector<uint8_t>& memory) {
    absl::StatusOr<RegionKey> key =
        fabric_->RegisterRegion(memory.data(), memory.size(), nullptr);
    EXPECT_TRUE(key.ok()) << key.status();
    return key.value_or(0);
  }

  // Posts a write of `bytes` from `from`+`from_offset` into window `window` at
  // `offset` and waits for its completion.
  Completion Write(RegionKey from, uint64_t from_offset, WindowKey window,
                   uint64_t offset, uint32_t bytes, uint64_t wr_id) {
    const size_t before = events_.completions().size();
    EXPECT_TRUE(fabric_
                    ->PostWrite(kSelf, 0,
                                WriteOp{.local_key = from,
                                        .local_offset = from_offset,
                                        .remote_key = window,
                                        .remote_offset = offset,
                                        .bytes = bytes,
                                        .imm = 7,
                                        .wr_id = wr_id})
                    .ok());
    EXPECT_TRUE(events_.WaitForCompletions(before + 1));
    return events_.completions().back();
  }

  testing::KeyRing keys_;
  testing::HostStager stager_;
  RecordingHandler events_;
  std::vector<uint8_t> source_ = std::vector<uint8_t>(1 << 16, 0xab);
  std::vector<uint8_t> target_ = std::vector<uint8_t>(1 << 16, 0);
  std::unique_ptr<InNodeFabric> fabric_;
};

TEST_F(InNodeFabricTest, CopiesIntoTheWindowAndTellsBothEnds) {
  const RegionKey from = Register(source_);
  const RegionKey to = Register(target_);
  const Extent extents[] = {{4096, 8192}};
  absl::StatusOr<WindowKey> window = fabric_->OpenWindow(to, "a", extents);
  ASSERT_TRUE(window.ok()) << window.status();
  for (size_t i = 0; i < source_.size(); ++i) source_[i] = static_cast<uint8_t>(i * 7);

  const Completion done = Write(from, 100, *window, 4096 + 512, 4096, 42);
  EXPECT_TRUE(done.status.ok()) << done.status;
  EXPECT_EQ(done.wr_id, 42u);
  EXPECT_EQ(done.nic, 0);
  EXPECT_EQ(std::memcmp(target_.data() + 4096 + 512, source_.data() + 100, 4096), 0);
  EXPECT_EQ(target_[4096 + 511], 0);  // nothing around it
  EXPECT_EQ(target_[4096 + 512 + 4096], 0);
  ASSERT_EQ(events_.arrivals().size(), 1u);
  const Arrival arrival = events_.arrivals()[0];
  EXPECT_EQ(arrival.peer, kSelf);
  EXPECT_EQ(arrival.window, *window);
  EXPECT_EQ(arrival.offset, 4096u + 512);
  EXPECT_EQ(arrival.bytes, 4096u);
  EXPECT_EQ(arrival.imm, 7u);
  EXPECT_EQ(fabric_->in_node_counters().host_bytes, 4096u);
  EXPECT_EQ(fabric_->FindPeer("a"), kSelf);
  EXPECT_EQ(fabric_->PeerName(kSelf), "a");

  // A notice: no bytes, only the immediate.
  ASSERT_TRUE(fabric_->PostWrite(kSelf, 0, WriteOp{.imm = 9, .wr_id = 43}).ok());
  ASSERT_TRUE(events_.WaitForArrivals(2));
  EXPECT_EQ(events_.arrivals()[1].imm, 9u);
  EXPECT_EQ(events_.arrivals()[1].window, 0u);
}

TEST_F(InNodeFabricTest, RefusedWritesPlaceNothing) {
  const RegionKey from = Register(source_);
  const RegionKey to = Register(target_);
  const Extent extents[] = {{0, 4096}};
  absl::StatusOr<WindowKey> mine = fabric_->OpenWindow(to, "a", extents);
  ASSERT_TRUE(mine.ok());

  Completion outside = Write(from, 0, *mine, 2048, 4096, 1);  // runs past the extent
  EXPECT_EQ(outside.refusal, Refusal::kOutsideWindow);
  EXPECT_EQ(outside.status.code(), absl::StatusCode::kOutOfRange);
  Completion unknown = Write(from, 0, *mine ^ 1, 0, 16, 2);
  EXPECT_EQ(unknown.refusal, Refusal::kNoWindow);
  // A window the node opened for a peer is the wrapped fabric's: not the lane's.
  absl::StatusOr<WindowKey> peers = fabric_->OpenWindow(to, "b", extents);
  ASSERT_TRUE(peers.ok());
  EXPECT_NE(*peers, *mine);
  EXPECT_EQ(Write(from, 0, *peers, 0, 16, 3).refusal, Refusal::kNoWindow);
  absl::Notification closed;
  fabric_->CloseWindow(*mine, [&] { closed.Notify(); });
  EXPECT_TRUE(closed.HasBeenNotified());  // nothing was placing
  EXPECT_EQ(Write(from, 0, *mine, 0, 16, 4).refusal, Refusal::kNoWindow);
  EXPECT_EQ(std::count(target_.begin(), target_.end(), 0), target_.size());
  EXPECT_TRUE(events_.arrivals().empty());
  EXPECT_EQ(fabric_->in_node_counters().refused_writes, 4u);
  fabric_->CloseWindow(*peers, [] {});

  // Checked as it is posted: a source extent outside its region, another lane.
  EXPECT_EQ(fabric_
                ->PostWrite(kSelf, 0,
                            WriteOp{.local_key = from,
                                    .local_offset = source_.size() - 8,
                                    .remote_key = *mine,
                                    .bytes = 16})
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fabric_->PostWrite(kSelf, 1, WriteOp{.imm = 1}).code(),
            absl::StatusCode::kUnavailable);
}

// A copier for the stager's "GPU memory", which is host memory; blocks each copy
// until `go` (when given) and says when one started. With `hang`, its copies never
// end: Wait answers as a copy past its bound does, and Start refuses after it.
class HostCopier final : public DeviceCopier {
 public:
  HostCopier(absl::Notification* go, absl::Notification* entered, bool hang = false,
             std::vector<std::shared_ptr<const void>>* kept = nullptr)
      : go_(go), entered_(entered), hang_(hang), kept_(kept) {}
  absl::Status Start(const Place& to, const Place& from, uint64_t bytes) override {
    if (spent_) return absl::FailedPreconditionError("spent");
    if (entered_ != nullptr && !entered_->HasBeenNotified()) entered_->Notify();
    if (go_ != nullptr) go_->WaitForNotification();
    if (!hang_) std::memcpy(to.base, from.base, bytes);
    return absl::OkStatus();
  }
  absl::Status Wait() override {
    if (!hang_) return absl::OkStatus();
    spent_ = true;
    return WithReason(absl::DeadlineExceededError("an in-node copy did not finish"),
                      reasons::kGpuCopyTimeout);
  }
  void KeepWhileBusy(std::shared_ptr<const void> memory) override {
    if (kept_ != nullptr) kept_->push_back(std::move(memory));
  }

 private:
  absl::Notification* go_;
  absl::Notification* entered_;
  const bool hang_;
  std::vector<std::shared_ptr<const void>>* kept_;
  bool spent_ = false;
};

TEST_F(InNodeFabricTest, GpuMemoryGoesThroughTheCopierAndFailsWithoutOne) {
  for (bool with_copier : {false, true}) {
    SCOPED_TRACE(with_copier ? "copier" : "no copier");
    InNodeOptions options;
    if (with_copier) {
      options.copier = [] {
        return absl::StatusOr<std::unique_ptr<DeviceCopier>>(
            std::make_unique<HostCopier>(nullptr, nullptr));
      };
    }
    Make(std::move(options));
    std::fill(target_.begin(), target_.end(), 0);
    const RegionKey from = Register(source_);
    absl::StatusOr<RegionKey> to = fabric_->RegisterDeviceRegion(
        reinterpret_cast<uintptr_t>(target_.data()), target_.size(), 0, nullptr);
    ASSERT_TRUE(to.ok()) << to.status();
    const Extent extents[] = {{0, 4096}};
    absl::StatusOr<WindowKey> window = fabric_->OpenWindow(*to, "a", extents);
    ASSERT_TRUE(window.ok());
    const Completion done = Write(from, 0, *window, 0, 4096, 1);
    if (with_copier) {
      EXPECT_TRUE(done.status.ok()) << done.status;
      EXPECT_EQ(std::memcmp(target_.data(), source_.data(), 4096), 0);
      EXPECT_EQ(fabric_->in_node_counters().device_bytes, 4096u);
    } else {
      EXPECT_EQ(done.status.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_EQ(done.refusal, Refusal::kNone);
      EXPECT_EQ(fabric_->in_node_counters().failed_copies, 1u);
      EXPECT_EQ(std::count(target_.begin(), target_.end(), 0), target_.size());
      EXPECT_TRUE(events_.arrivals().empty());
    }
  }
}

// A GPU copy past its bound: the move fails with its own reason, the regions its copy
// may still touch are kept, and the lane goes on with a new copier.
TEST_F(InNodeFabricTest, ACopyPastItsBoundFailsTheMoveKeepsItsMemoryAndTheLaneGoesOn) {
  std::vector<std::shared_ptr<const void>> kept;
  int made = 0;
  Make(InNodeOptions{.node = "a", .workers = 1, .copier = [&] {
                       // The first copier hangs; the one made after it works.
                       return absl::StatusOr<std::unique_ptr<DeviceCopier>>(
                           std::make_unique<HostCopier>(nullptr, nullptr, made++ == 0,
                                                        &kept));
                     }});
  std::fill(target_.begin(), target_.end(), 0);
  const RegionKey from = Register(source_);
  absl::StatusOr<RegionKey> to = fabric_->RegisterDeviceRegion(
      reinterpret_cast<uintptr_t>(target_.data()), target_.size(), 0, nullptr);
  ASSERT_TRUE(to.ok()) << to.status();
  const Extent extents[] = {{0, 8192}};
  absl::StatusOr<WindowKey> window = fabric_->OpenWindow(*to, "a", extents);
  ASSERT_TRUE(window.ok());

  const Completion hung = Write(from, 0, *window, 0, 4096, 1);
  EXPECT_EQ(hung.status.code(), absl::StatusCode::kDeadlineExceeded) << hung.status;
  EXPECT_EQ(ReasonOf(hung.status), "GPU_COPY_TIMEOUT");
  EXPECT_EQ(kept.size(), 2u);  // the source region and the target region
  EXPECT_TRUE(events_.arrivals().empty());
  EXPECT_EQ(fabric_->in_node_counters().failed_copies, 1u);

  const Completion next = Write(from, 4096, *window, 4096, 4096, 2);
  EXPECT_TRUE(next.status.ok()) << next.status;
  EXPECT_EQ(made, 2);
  EXPECT_EQ(std::memcmp(target_.data() + 4096, source_.data() + 4096, 4096), 0);
}

TEST_F(InNodeFabricTest, AFullQueuePushesBackAndNoQueuedWriteIsLost) {
  absl::Notification go, entered;
  Make(InNodeOptions{.node = "a", .workers = 1, .queue_depth = 2, .copier = [&] {
                       return absl::StatusOr<std::unique_ptr<DeviceCopier>>(
                           std::make_unique<HostCopier>(&go, &entered));
                     }});
  const RegionKey from = Register(source_);
  absl::StatusOr<RegionKey> to = fabric_->RegisterDeviceRegion(
      reinterpret_cast<uintptr_t>(target_.data()), target_.size(), 0, nullptr);
  ASSERT_TRUE(to.ok()) << to.status();
  const Extent extents[] = {{0, 1 << 16}};
  absl::StatusOr<WindowKey> window = fabric_->OpenWindow(*to, "a", extents);
  ASSERT_TRUE(window.ok());
  auto op = [&](uint64_t wr_id) {
    return WriteOp{.local_key = from,
                   .local_offset = wr_id * 64,
                   .remote_key = *window,
                   .remote_offset = wr_id * 64,
                   .bytes = 64,
                   .wr_id = wr_id};
  };
  ASSERT_TRUE(fabric_->PostWrite(kSelf, 0, op(1)).ok());
  entered.WaitForNotification();  // the worker holds write 1: two more fill the queue
  ASSERT_TRUE(fabric_->PostWrite(kSelf, 0, op(2)).ok());
  ASSERT_TRUE(fabric_->PostWrite(kSelf, 0, op(3)).ok());
  EXPECT_EQ(fabric_->PostWrite(kSelf, 0, op(4)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(fabric_->PostWrite(kSelf, 0, WriteOp{.imm = 5, .wr_id = 5}).ok());
  // Stopping while writes are queued: each still completes once (OK, or UNAVAILABLE
  // for those the workers did not reach).
  std::thread stop([&] { fabric_.reset(); });
  go.Notify();
  stop.join();
  std::vector<uint64_t> ids;
  for (const Completion& c : events_.completions()) {
    ids.push_back(c.wr_id);
    EXPECT_TRUE(c.status.ok() || c.status.code() == absl::StatusCode::kUnavailable)
        << c.status;
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2, 3, 5}));
}

}  // namespace
}  // namespace fuselink::fabric
