// The GPU relay's fence under the copy bound, on a real GPU: a slot whose stage the
// fabric stopped waiting for is quarantined when released, lent to nobody while the
// copy may still write it, and lent again once the copy has ended. A 1 us bound under
// a 256 MiB device copy, which cannot end within it.
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/fabric_keys.h"
#include "agent/fabric/tcp/fabric.h"
#include "agent/gpu/copy_bound.h"
#include "agent/gpu/memory.h"
#include "agent/gpu/runtime.h"
#include "agent/relay/device_stager.h"
#include "agent/relay/gpu_relay_pool.h"
#include "tests/gpu/gpu_test_util.h"

namespace fuselink::gpu::testing {
namespace {

class NoEvents final : public fabric::Handler {
 public:
  void OnCompletion(const fabric::Completion&) override {}
  void OnArrival(const fabric::Arrival&) override {}
  void OnPeerLost(fabric::PeerId, absl::string_view, const absl::Status&) override {}
};

class RelayBoundTest : public GpuTest {};

TEST_F(RelayBoundTest, ASlotWhoseCopyOutlivedTheBoundIsLentAgainOnlyOnceItEnds) {
  constexpr uint32_t kBytes = 256u << 20;
  absl::StatusOr<std::unique_ptr<Runtime>> runtime = Runtime::Open(8);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  NoEvents events;
  fabric::FabricKeys keys;
  CopyBound tight(absl::Microseconds(1));
  // The fabric takes GPU regions (the relay's slots) only with a stager.
  relay::CudaDeviceStager stager(runtime->get(), &tight, {0}, 1 << 20);
  fabric::TcpFabricOptions options;
  options.node_name = "relay-bound";
  options.nics.push_back({0, "127.0.0.1", 0});
  options.keys = &keys;
  options.device_stager = &stager;
  absl::StatusOr<std::unique_ptr<fabric::Fabric>> fabric =
      fabric::CreateTcpFabric(options, &events);
  ASSERT_TRUE(fabric.ok()) << fabric.status();
  relay::GpuRelayOptions relay_options;
  relay_options.slot_bytes = kBytes;
  relay_options.cap_bytes_per_gpu = kBytes;  // one slot, no more
  relay_options.min_free_bytes = 0;
  relay_options.idle = absl::Hours(1);
  absl::StatusOr<std::unique_ptr<relay::GpuRelayPool>> pool = relay::GpuRelayPool::Create(
      fabric->get(), runtime->get(), &tight, {0}, relay_options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  absl::StatusOr<DeviceBuffer> source =
      DeviceBuffer::Allocate((*runtime)->context(0), kBytes);
  ASSERT_TRUE(source.ok()) << source.status();

  const relay::Slot slot = (*pool)->Acquire(0);
  ASSERT_TRUE(slot.valid());
  FL_ASSERT_OK((*pool)->Stage(
      slot,
      relay::Source{.data = reinterpret_cast<const uint8_t*>(source->ptr()), .gpu = 0},
      kBytes));
  ASSERT_NE(slot.ready, nullptr);
  const absl::Status waited = slot.ready->Wait();
  EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
  EXPECT_EQ(ReasonOf(waited), "GPU_COPY_TIMEOUT");
  // Asked again (the engine's release waits on the fence): no second wait.
  EXPECT_EQ(slot.ready->Wait().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tight.timeouts(), 1u);

  (*pool)->Release(slot);
  EXPECT_FALSE((*pool)->TryAcquire(0).valid()) << "lent while its copy may run";
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  relay::Slot again;
  while (!again.valid() && absl::Now() < give_up) {
    (*pool)->Maintain(absl::Now());
    again = (*pool)->TryAcquire(0);
    if (!again.valid()) absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(again.valid()) << "the slot never came back";
  EXPECT_EQ(again.index, slot.index);
  (*pool)->Release(again);
}

}  // namespace
}  // namespace fuselink::gpu::testing
