// GPU regions on the verbs fabric, on real RDMA devices: staged writes out of and into
// "GPU" memory (the stand-in stager of tests/fabric), relayed sends behind a fence,
// faults that fail only their own write, the bad requests' codes, and the fabric
// without a stager. The fixture it extends is in verbs_fabric_test_util.h.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "agent/fabric/verbs/fabric.h"
#include "gtest/gtest.h"
#include "tests/fabric/test_util.h"
#include "tests/rdma/verbs_fabric_test_util.h"

namespace fuselink::fabric {
namespace {

using testing::DrainCounter;
using testing::kUntouched;
using testing::ManyBytes;
using testing::VerbsFabricTest;
using Clock = std::chrono::steady_clock;

// GPU regions on verbs where no NIC reaches GPU memory (the VM: no dma-buf, no peer
// memory): both sides stage through the stand-in stager, whose "device memory" is
// host memory.
class VerbsGpuTest : public VerbsFabricTest {
 protected:
  static constexpr uint32_t kSlotBytes = 64 << 10;
  void MakeStaged(int nic_count, uint64_t max_shadow_bytes = uint64_t{1} << 30,
                  uint32_t slot_bytes = kSlotBytes, int qps = 2) {
    auto gpus = [=](testing::HostStager* stager) {
      return [=](VerbsFabricOptions& o) {
        o.device_stager = stager;
        o.gpu_count = 2;
        o.staging_slots_per_nic = 4;
        o.staging_slot_bytes = slot_bytes;
        o.max_shadow_bytes = max_shadow_bytes;
      };
    };
    Make(nic_count, qps, gpus(&b_stager_), gpus(&a_stager_));
  }
  // A GPU region of `memory` on `gpu`.
  RegionKey DeviceRegion(Fabric& fabric, std::vector<uint8_t>& memory, int gpu) {
    absl::StatusOr<RegionKey> key = fabric.RegisterDeviceRegion(
        reinterpret_cast<uint64_t>(memory.data()), memory.size(), gpu, nullptr);
    EXPECT_TRUE(key.ok()) << key.status();
    return key.value_or(0);
  }

  // a's completions from the `from`th on that failed: "none", or how many and the
  // first one's status.
  std::string Failed(size_t from) const {
    const std::vector<Completion> done = a_events_.completions();
    size_t failed = 0;
    std::string first;
    for (size_t i = from; i < done.size(); ++i) {
      if (done[i].status.ok()) continue;
      if (failed++ == 0) first = done[i].status.ToString();
    }
    return failed == 0 ? "none" : absl::StrCat(failed, ", the first: ", first);
  }

  testing::HostStager a_stager_, b_stager_;  // outlive the fabrics
  testing::Buffers buffers_;
};

#define FL_MAKE_STAGED(...)                       \
  do {                                            \
    MakeStaged(__VA_ARGS__);                      \
    if (HasFatalFailure() || IsSkipped()) return; \
  } while (0)

// GPU to GPU and host to GPU, staged on both sides over two NICs: every byte lands
// where it should and nowhere else, and an arrival is delivered only once its bytes
// are in GPU memory.
TEST_F(VerbsGpuTest, StagedWritesLandExactlyOnBothSides) {
  FL_MAKE_STAGED(2);
  for (int nic = 0; nic < 2; ++nic) {
    EXPECT_EQ(a_->GpuPath(0, nic), "staged");
    EXPECT_EQ(b_->GpuPath(1, nic), "staged");
  }
  EXPECT_EQ(a_->GpuPath(2, 0), "none");
  constexpr size_t kWrites = 64;
  std::vector<uint8_t>& gpu_source = buffers_.Keep(ManyBytes(kWrites * kSlotBytes, 1));
  std::vector<uint8_t>& host_source = buffers_.Keep(ManyBytes(kWrites * kSlotBytes, 2));
  std::vector<uint8_t>& target =
      buffers_.Keep(std::vector<uint8_t>(kWrites * kSlotBytes, kUntouched));
  std::vector<uint8_t> expected = target;
  const RegionKey from_gpu = DeviceRegion(*a_, gpu_source, 0);
  const RegionKey from_host = Region(*a_, host_source);
  const RegionKey into = DeviceRegion(*b_, target, 1);
  const WindowKey window = Window(into, "a", {{0, target.size()}});

  std::mt19937 random(3);
  std::vector<WriteOp> ops;
  uint64_t staged_out = 0, staged_in = 0;
  for (size_t i = 0; i < kWrites; ++i) {
    const uint32_t bytes = 1 + random() % kSlotBytes;
    const uint64_t remote = i * kSlotBytes + random() % (kSlotBytes - bytes + 1);
    const uint64_t local = random() % (kWrites * kSlotBytes - bytes + 1);
    const bool gpu = i % 3 != 2;
    std::memcpy(&expected[remote], &(gpu ? gpu_source : host_source)[local], bytes);
    if (gpu) staged_out += bytes;
    staged_in += bytes;
    ops.push_back({.local_key = gpu ? from_gpu : from_host,
                   .local_offset = local,
                   .remote_key = window,
                   .remote_offset = remote,
                   .bytes = bytes,
                   .imm = static_cast<uint32_t>(i),
                   .wr_id = i});
  }
  std::atomic<int> early{0};
  b_events_.SetCheck([&](const Arrival& arrival) {
    if (std::memcmp(&target[arrival.offset], &expected[arrival.offset], arrival.bytes))
      ++early;
  });
  for (size_t i = 0; i < kWrites; ++i) {
    ASSERT_TRUE(Post(static_cast<int>(i % 2), ops[i]).ok()) << i;
  }
  ASSERT_TRUE(a_events_.WaitForCompletions(kWrites));
  ASSERT_TRUE(b_events_.WaitForArrivals(kWrites));
  for (const Completion& c : a_events_.completions()) {
    EXPECT_TRUE(c.status.ok()) << c.wr_id << ": " << c.status;
  }
  EXPECT_EQ(early, 0) << "arrivals delivered before their bytes were in GPU memory";
  EXPECT_TRUE(target == expected) << "target bytes differ";
  EXPECT_EQ(a_stager_.log().to_host_bytes, staged_out);
  EXPECT_EQ(a_stager_.log().last_source_gpu, 0);
  EXPECT_EQ(b_stager_.log().to_device_bytes, staged_in);
  EXPECT_EQ(b_stager_.log().last_target_gpu, 1);
  EXPECT_EQ(b_->counters(0).received_bytes + b_->counters(1).received_bytes, staged_in);
  b_events_.SetCheck(nullptr);

  // The window's shadow is freed with its close; a's bounce slots stay for reuse.
  EXPECT_GT(b_stager_.log().pinned_bytes, 0u);
  DrainCounter drained;
  b_->CloseWindow(window, drained.Callback());
  EXPECT_EQ(drained.WaitFor(1), 1);
  EXPECT_EQ(b_stager_.log().pinned_bytes, 0u);
  EXPECT_EQ(a_stager_.log().pinned_bytes, 2 * 4 * kSlotBytes);  // 4 slots on each NIC
}

// A relayed send: the source is in a relay slot on another GPU, written by a copy the
// write must wait for. A fence that fails and a staging copy that fails each fail
// their own write (UNAVAILABLE: the engine sends it over another NIC), place nothing,
// and the next write goes through.
TEST_F(VerbsGpuTest, RelayedSendsWaitForTheirFenceAndAFaultFailsOnlyItsWrite) {
  FL_MAKE_STAGED(1);
  // The relay's copy into the slot is what the fence stands for: the slot holds its
  // bytes only once the fence is waited for.
  const std::vector<uint8_t> relayed = ManyBytes(4 * kSlotBytes, 4);
  std::vector<uint8_t>& slot = buffers_.Keep(std::vector<uint8_t>(4 * kSlotBytes, 0));
  std::vector<uint8_t>& target =
      buffers_.Keep(std::vector<uint8_t>(4 * kSlotBytes, kUntouched));
  const RegionKey from = DeviceRegion(*a_, slot, 1);
  const WindowKey window = Window(Region(*b_, target), "a", {{0, target.size()}});
  auto op = [&](uint64_t i, Fence* after) {
    return WriteOp{.local_key = from,
                   .local_offset = i * kSlotBytes,
                   .remote_key = window,
                   .remote_offset = i * kSlotBytes,
                   .bytes = kSlotBytes,
                   .imm = static_cast<uint32_t>(i),
                   .wr_id = i,
                   .after = after};
  };
  auto landed = [&](uint64_t i) {
    return std::memcmp(&target[i * kSlotBytes], &relayed[i * kSlotBytes], kSlotBytes) ==
           0;
  };
  auto untouched = [&](uint64_t i) {
    return std::all_of(target.begin() + i * kSlotBytes,
                       target.begin() + (i + 1) * kSlotBytes,
                       [](uint8_t b) { return b == kUntouched; });
  };
  auto relay = [&](uint64_t i) {
    return [&, i] {
      std::memcpy(&slot[i * kSlotBytes], &relayed[i * kSlotBytes], kSlotBytes);
    };
  };
  testing::CountingFence passes(absl::OkStatus(), relay(0));
  testing::CountingFence fails(absl::InternalError("the relay copy faulted"));

  ASSERT_TRUE(Post(0, op(0, &passes)).ok());
  std::optional<Completion> first = CompletionOf(0);
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(first->status.ok()) << first->status;
  EXPECT_EQ(passes.waits, 1);

  ASSERT_TRUE(Post(0, op(1, &fails)).ok());
  std::optional<Completion> fenced = CompletionOf(1);
  ASSERT_TRUE(fenced.has_value());
  EXPECT_EQ(fenced->status.code(), absl::StatusCode::kUnavailable) << fenced->status;
  EXPECT_EQ(fails.waits, 1);

  relay(2)();
  relay(3)();
  a_stager_.log().fail_copy = a_stager_.log().copies + 1;
  ASSERT_TRUE(Post(0, op(2, nullptr)).ok());
  std::optional<Completion> faulted = CompletionOf(2);
  ASSERT_TRUE(faulted.has_value());
  EXPECT_EQ(faulted->status.code(), absl::StatusCode::kUnavailable) << faulted->status;

  ASSERT_TRUE(Post(0, op(3, nullptr)).ok());
  std::optional<Completion> after = CompletionOf(3);
  ASSERT_TRUE(after.has_value());
  EXPECT_TRUE(after->status.ok()) << after->status;
  ASSERT_TRUE(b_events_.WaitForArrivals(2));
  EXPECT_TRUE(landed(0));
  EXPECT_TRUE(untouched(1));
  EXPECT_TRUE(untouched(2));
  EXPECT_TRUE(landed(3));
  EXPECT_EQ(b_events_.arrivals().size(), 2u);
}

// A staged arrival whose copy into GPU memory fails is not delivered (the transfer's
// landing misses its bytes and says so in its verdict); the NIC's next arrival is.
TEST_F(VerbsGpuTest, AStagedArrivalWhoseCopyFailsIsNotDelivered) {
  // One QP: the two writes arrive in their order, so the fault hits the first.
  FL_MAKE_STAGED(1, uint64_t{1} << 30, kSlotBytes, /*qps=*/1);
  std::vector<uint8_t>& source = buffers_.Keep(ManyBytes(2 * kSlotBytes, 5));
  std::vector<uint8_t>& target =
      buffers_.Keep(std::vector<uint8_t>(2 * kSlotBytes, kUntouched));
  const RegionKey from = Region(*a_, source);
  const WindowKey window =
      Window(DeviceRegion(*b_, target, 0), "a", {{0, target.size()}});
  b_stager_.log().fail_copy = b_stager_.log().copies + 1;
  for (uint64_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(Post(0, {.local_key = from,
                         .local_offset = i * kSlotBytes,
                         .remote_key = window,
                         .remote_offset = i * kSlotBytes,
                         .bytes = kSlotBytes,
                         .imm = static_cast<uint32_t>(10 + i),
                         .wr_id = i})
                    .ok());
  }
  ASSERT_TRUE(a_events_.WaitForCompletions(2));
  for (const Completion& c : a_events_.completions()) EXPECT_TRUE(c.status.ok());
  ASSERT_TRUE(b_events_.WaitForArrivals(1));
  const std::vector<Arrival> arrivals = b_events_.arrivals();
  ASSERT_EQ(arrivals.size(), 1u);
  EXPECT_EQ(arrivals[0].imm, 11u);
  EXPECT_EQ(std::memcmp(&target[kSlotBytes], &source[kSlotBytes], kSlotBytes), 0);
  EXPECT_EQ(b_->counters(0).received_bytes, kSlotBytes);
}

// What a caller gets wrong, each with its code; the fabric goes on.
TEST_F(VerbsGpuTest, BadGpuRequestsGetTheirCode) {
  FL_MAKE_STAGED(1, /*max_shadow_bytes=*/kSlotBytes + 4096);  // + in-page offset
  std::vector<uint8_t>& memory = buffers_.Keep(ManyBytes(4 * kSlotBytes, 6));
  std::vector<uint8_t>& target =
      buffers_.Keep(std::vector<uint8_t>(4 * kSlotBytes, kUntouched));
  EXPECT_EQ(a_->RegisterDeviceRegion(reinterpret_cast<uint64_t>(memory.data()),
                                     memory.size(), 2, nullptr)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a_->RegisterDeviceRegion(0, memory.size(), 0, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  const RegionKey into = DeviceRegion(*b_, target, 0);
  // The shadow budget: one slot's worth (and its in-page offset), so a window of two
  // slots does not fit.
  EXPECT_EQ(
      b_->OpenWindow(into, "a", std::vector<Extent>{{0, 2 * kSlotBytes}}).status().code(),
      absl::StatusCode::kResourceExhausted);
  const WindowKey window = Window(into, "a", {{0, kSlotBytes}});
  const RegionKey from = DeviceRegion(*a_, memory, 0);
  // A staged write is at most one bounce slot.
  EXPECT_EQ(a_->PostWrite(b_on_a_, 0,
                          {.local_key = from,
                           .remote_key = window,
                           .bytes = kSlotBytes + 1,
                           .wr_id = 1})
                .code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(
      Post(0, {.local_key = from, .remote_key = window, .bytes = kSlotBytes, .wr_id = 2})
          .ok());
  std::optional<Completion> done = CompletionOf(2);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->status.ok()) << done->status;
  ASSERT_TRUE(b_events_.WaitForArrivals(1));
  EXPECT_EQ(std::memcmp(target.data(), memory.data(), kSlotBytes), 0);
}

// Issue 32: a stopped target holds at most its share of a NIC's bounce slots, and the
// NIC's sender serves the other peers meanwhile. b's poller stops inside its first
// arrival and its NIC answers RNR (retried forever, the watchdog out of the way), so
// b's staged writes past its receives stay in flight; staged writes to a third node,
// c, over the same NIC still complete. Once b goes on, its writes land in their order.
TEST_F(VerbsGpuTest, AStoppedTargetHoldsOnlyItsShareOfBounceSlots) {
  constexpr uint32_t kReceives = 4;  // b's receives per QP: RNR from the 6th write on
  constexpr int kToB = 10;
  constexpr int kToC = 4;
  FabricKeys* c_keys = keys_.For("c");  // before a exists: agreed with a's keys
  FL_MAKE(
      1, 1, [](VerbsFabricOptions& b) { b.recv_depth_per_qp = kReceives; },
      [&](VerbsFabricOptions& a) {
        a.device_stager = &a_stager_;
        a.gpu_count = 1;
        a.staging_slots_per_nic = 4;  // a share of 3 (DefaultSlotsPerPeer)
        a.staging_slot_bytes = kSlotBytes;
        // b's writes stay in flight until b goes on: RNR retried forever, and the
        // transport's retries (which rxe under emulation may spend on RNR'd writes)
        // and the watchdog well beyond the test.
        a.rc.rnr_retry = 7;
        a.rc.timeout = 18;  // about 1.07 s a try
        a.rc.retry_cnt = 7;
        a.ack_timeout = absl::Seconds(60);
      });
  testing::RecordingHandler c_events;  // outlives c
  VerbsFabricOptions c_options;
  c_options.node_name = "c";
  c_options.keys = c_keys;
  c_options.nics = {{.nic = 0, .address = testing::Rails()[0].b}};
  absl::StatusOr<std::unique_ptr<Fabric>> c = CreateVerbsFabric(c_options, &c_events);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<PeerId> c_on_a = a_->Connect("c", (*c)->endpoints());
  ASSERT_TRUE(c_on_a.ok()) << c_on_a.status();

  std::vector<uint8_t>& source = buffers_.Keep(ManyBytes((kToB + kToC) * kSlotBytes, 9));
  std::vector<uint8_t>& b_target =
      buffers_.Keep(std::vector<uint8_t>(kToB * kSlotBytes, kUntouched));
  std::vector<uint8_t>& c_target =
      buffers_.Keep(std::vector<uint8_t>(kToC * kSlotBytes, kUntouched));
  const RegionKey from = DeviceRegion(*a_, source, 0);
  const WindowKey b_window = Window(Region(*b_, b_target), "a", {{0, b_target.size()}});
  absl::StatusOr<RegionKey> c_region =
      (*c)->RegisterRegion(c_target.data(), c_target.size(), nullptr);
  ASSERT_TRUE(c_region.ok()) << c_region.status();
  absl::StatusOr<WindowKey> c_window =
      (*c)->OpenWindow(*c_region, "a", std::vector<Extent>{{0, c_target.size()}});
  ASSERT_TRUE(c_window.ok()) << c_window.status();
  auto op = [&](int i, WindowKey window, uint64_t remote) {
    return WriteOp{.local_key = from,
                   .local_offset = uint64_t(i) * kSlotBytes,
                   .remote_key = window,
                   .remote_offset = remote * kSlotBytes,
                   .bytes = kSlotBytes,
                   .imm = static_cast<uint32_t>(i),
                   .wr_id = uint64_t(i)};
  };
  absl::Notification thaw;
  b_events_.SetCheck([&](const Arrival&) {
    thaw.WaitForNotificationWithTimeout(testing::kWaitTimeout + absl::Seconds(30));
  });
  for (int i = 0; i < kToB; ++i) ASSERT_TRUE(Post(0, op(i, b_window, i)).ok()) << i;
  // b's receives take its first writes; then b holds its share, stuck, and its next
  // write waits for it. Only then c's writes come (queued together, they would have
  // taken slots in turn with b's before b was stuck).
  for (int i = 0; i < static_cast<int>(kReceives); ++i) {
    std::optional<Completion> done = CompletionOf(uint64_t(i));
    ASSERT_TRUE(done.has_value()) << i;
    EXPECT_TRUE(done->status.ok()) << i << ": " << done->status;
  }
  // Time for the sender to post what b's share allows; the writes past b's receives
  // stay in flight (RNR). A share of all the slots makes c's writes below wait.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_GE(a_->counters(0).staged_share_waits, 1u) << "b's writes never met its share";
  for (int i = kToB; i < kToB + kToC; ++i) {
    ASSERT_TRUE(a_->PostWrite(*c_on_a, 0, op(i, *c_window, i - kToB)).ok()) << i;
  }
  for (int i = kToB; i < kToB + kToC; ++i) {
    std::optional<Completion> done = CompletionOf(uint64_t(i));
    ASSERT_TRUE(done.has_value()) << "b's stuck writes held up c's write " << i;
    EXPECT_TRUE(done->status.ok()) << done->status;
  }
  ASSERT_TRUE(c_events.WaitForArrivals(kToC));
  EXPECT_EQ(std::memcmp(c_target.data(), &source[kToB * kSlotBytes], c_target.size()), 0);
  size_t b_done = 0;
  for (const Completion& done : a_events_.completions())
    b_done += done.wr_id < uint64_t{kToB};
  EXPECT_LT(b_done, size_t{kToB}) << "b was not stuck: the check proves nothing";

  thaw.Notify();
  b_events_.SetCheck(nullptr);  // waits for a check that is running
  for (int i = 0; i < kToB; ++i) {
    std::optional<Completion> done = CompletionOf(uint64_t(i));
    ASSERT_TRUE(done.has_value()) << i;
    EXPECT_TRUE(done->status.ok()) << i << ": " << done->status;
  }
  ASSERT_TRUE(b_events_.WaitForArrivals(kToB));
  std::vector<uint32_t> order;
  for (const Arrival& arrival : b_events_.arrivals()) order.push_back(arrival.imm);
  std::vector<uint32_t> posted(kToB);
  std::iota(posted.begin(), posted.end(), 0u);
  EXPECT_EQ(order, posted) << "one peer's writes left its queue out of order";
  EXPECT_EQ(std::memcmp(b_target.data(), source.data(), b_target.size()), 0);
  a_->Disconnect(*c_on_a);
}

// Not a pass/fail test: verbs writes of 1 MiB out of and into "GPU" memory that the
// NIC reaches only by staging, beside host memory to host memory on the same link, in
// rounds that alternate (docs/benchmarks.md).
TEST_F(VerbsGpuTest, ThroughputStagedAgainstHostMemory) {
  constexpr uint32_t kChunk = 1 << 20;
  constexpr int kDepth = 8;  // writes in flight, as the engine's window keeps them
  FL_MAKE_STAGED(1, uint64_t{1} << 30, kChunk);
  std::vector<uint8_t>& a_host = buffers_.Keep(ManyBytes(kChunk, 7));
  std::vector<uint8_t>& a_gpu = buffers_.Keep(ManyBytes(kChunk, 8));
  std::vector<uint8_t>& b_host = buffers_.Keep(std::vector<uint8_t>(kDepth * kChunk));
  std::vector<uint8_t>& b_gpu = buffers_.Keep(std::vector<uint8_t>(kDepth * kChunk));
  const RegionKey from[2] = {Region(*a_, a_host), DeviceRegion(*a_, a_gpu, 0)};
  const WindowKey into[2] = {
      Window(Region(*b_, b_host), "a", {{0, b_host.size()}}),
      Window(DeviceRegion(*b_, b_gpu, 0), "a", {{0, b_gpu.size()}})};
  const char* kSide[2] = {"host", "staged GPU"};
  uint64_t wr_id = 0;
  for (int round = 0; round < 2; ++round) {
    for (int variant = 0; variant < 4; ++variant) {
      const int src = variant & 1, dst = variant >> 1;
      const size_t before = a_events_.completions().size();
      const size_t delivered = b_events_.arrivals().size();
      size_t posted = 0;
      const auto started = Clock::now();
      while (Clock::now() - started < std::chrono::seconds(3)) {
        // In flight until delivered at b (after the landing's copy), not just ACKed. A
        // write that failed is never delivered: the wait is bounded, and the checks
        // below then say what went wrong instead of the loop spinning forever.
        const auto give_up = Clock::now() + std::chrono::seconds(20);
        const auto waiting = [&] {
          return posted - (b_events_.arrivals().size() - delivered);
        };
        while (waiting() >= kDepth && Clock::now() < give_up) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        ASSERT_LT(waiting(), kDepth)
            << "no arrival for 20 s; " << Failed(before) << " of the completions failed";
        ASSERT_TRUE(Post(0, {.local_key = from[src],
                             .remote_key = into[dst],
                             .remote_offset = (posted % kDepth) * kChunk,
                             .bytes = kChunk,
                             .wr_id = wr_id++})
                        .ok());
        ++posted;
      }
      ASSERT_TRUE(a_events_.WaitForCompletions(before + posted))
          << a_events_.completions().size() - before << " of " << posted << " completed";
      ASSERT_EQ(Failed(before), "none");
      ASSERT_TRUE(b_events_.WaitForArrivals(delivered + posted))
          << b_events_.arrivals().size() - delivered << " of " << posted
          << " arrived, all completed OK";
      const double seconds =
          std::chrono::duration<double>(Clock::now() - started).count();
      std::printf("bench: verbs 1 MiB writes, %s -> %s, round %d: %.3f Gbit/s\n",
                  kSide[src], kSide[dst], round, posted * kChunk * 8 / seconds / 1e9);
    }
  }
  for (const Completion& c : a_events_.completions()) ASSERT_TRUE(c.status.ok());
}

// Without a device stager the fabric refuses GPU memory, saying why.
TEST_F(VerbsFabricTest, GpuRegionsNeedAStager) {
  FL_MAKE(1, 1);
  std::vector<uint8_t> memory(4096);
  EXPECT_EQ(a_->GpuPath(0, 0), "none");
  EXPECT_EQ(a_->RegisterDeviceRegion(reinterpret_cast<uint64_t>(memory.data()),
                                     memory.size(), 0, nullptr)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace fuselink::fabric
