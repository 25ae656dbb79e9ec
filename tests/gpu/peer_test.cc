// Two GPUs: peer copies and a kernel storing into a peer's VMM memory. Skips, saying
// so, on machines with fewer than two.
#include <cstdio>

#include "agent/gpu/copy_kernel.h"
#include "agent/gpu/memory.h"
#include "agent/gpu/vmm.h"
#include "tests/gpu/gpu_test_util.h"

namespace fuselink::gpu::testing {
namespace {

class PeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::optional<std::string> why = WhyNoGpus(2)) GTEST_SKIP() << *why;
    const Driver* driver = *Driver::Load();
    auto can = CanAccessPeer(*driver, 0, 1);
    ASSERT_TRUE(can.ok()) << can.status();
    if (!*can) GTEST_SKIP() << "GPU 0 cannot access GPU 1 as a peer";
    for (int i = 0; i < 2; ++i) {
      auto context = PrimaryContext::Retain(*driver, i);
      ASSERT_TRUE(context.ok()) << context.status();
      contexts_[i].emplace(std::move(*context));
    }
    FL_ASSERT_OK(EnablePeerAccess(*contexts_[0], *contexts_[1]));
    FL_ASSERT_OK(EnablePeerAccess(*contexts_[1], *contexts_[0]));
    FL_ASSERT_OK(EnablePeerAccess(*contexts_[0], *contexts_[1]));  // again: fine
    for (int i = 0; i < 2; ++i) {
      auto stream = Stream::Create(*contexts_[i]);
      ASSERT_TRUE(stream.ok()) << stream.status();
      streams_[i].emplace(std::move(*stream));
    }
  }
  std::optional<PrimaryContext> contexts_[2];
  std::optional<Stream> streams_[2];
};

TEST_F(PeerTest, PeerCopyMovesBytesBothWays) {
  constexpr size_t kBytes = (size_t{48} << 20) + 77;
  auto on0 = DeviceBuffer::Allocate(*contexts_[0], kBytes);
  auto on1 = DeviceBuffer::Allocate(*contexts_[1], kBytes);
  ASSERT_TRUE(on0.ok() && on1.ok()) << on0.status() << on1.status();
  const uint64_t seed = RandomSeed();
  FL_ASSERT_OK(WriteDevice(*streams_[0], on0->ptr(), Pattern(kBytes, seed)));
  FL_ASSERT_OK(streams_[0]->CopyPeer(on1->ptr(), *contexts_[1], on0->ptr(), *contexts_[0],
                                     kBytes));
  FL_ASSERT_OK(streams_[0]->Synchronize());
  auto seen = ReadDevice(*streams_[1], on1->ptr(), kBytes);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_TRUE(*seen == Pattern(kBytes, seed));

  FL_ASSERT_OK(WriteDevice(*streams_[1], on1->ptr(), Pattern(kBytes, seed + 1)));
  FL_ASSERT_OK(streams_[1]->CopyPeer(on0->ptr(), *contexts_[0], on1->ptr(), *contexts_[1],
                                     kBytes));
  FL_ASSERT_OK(streams_[1]->Synchronize());
  seen = ReadDevice(*streams_[0], on0->ptr(), kBytes);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_TRUE(*seen == Pattern(kBytes, seed + 1));
}

TEST_F(PeerTest, KernelStoresIntoPeersVmmMemory) {
  const int reader[] = {0};
  auto remote = VmmBuffer::Create(*contexts_[1], size_t{32} << 20, reader);
  ASSERT_TRUE(remote.ok()) << remote.status();
  const size_t size = remote->size_bytes();
  auto local = DeviceBuffer::Allocate(*contexts_[0], size);
  ASSERT_TRUE(local.ok()) << local.status();
  auto kernel = CopyKernel::Load(*contexts_[0]);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  const uint64_t seed = RandomSeed();
  FL_ASSERT_OK(WriteDevice(*streams_[0], local->ptr(), Pattern(size, seed)));
  FL_ASSERT_OK(kernel->Launch(*streams_[0], remote->ptr(), local->ptr(), size));
  FL_ASSERT_OK(streams_[0]->Synchronize());
  auto seen = ReadDevice(*streams_[1], remote->ptr(), size);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_TRUE(*seen == Pattern(size, seed));
}

TEST_F(PeerTest, GuardsNestAcrossGpus) {
  const DriverApi& api = contexts_[0]->driver().api();
  cu::CUcontext current = nullptr;
  DeviceGuard outer(*contexts_[0]);
  FL_ASSERT_OK(outer.status());
  {
    DeviceGuard inner(*contexts_[1]);
    FL_ASSERT_OK(inner.status());
    ASSERT_EQ(api.cuCtxGetCurrent(&current), cu::CUDA_SUCCESS);
    EXPECT_EQ(current, contexts_[1]->get());
  }
  ASSERT_EQ(api.cuCtxGetCurrent(&current), cu::CUDA_SUCCESS);
  EXPECT_EQ(current, contexts_[0]->get());
}

}  // namespace
}  // namespace fuselink::gpu::testing
