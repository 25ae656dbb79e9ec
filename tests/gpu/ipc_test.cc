// CUDA IPC: another process allocates with cuMemAlloc and exports the handle; this one
// opens it with an offset and size and reads that process's bytes.
#include "agent/gpu/ipc.h"

#include <cstring>

#include "agent/common/status_macros.h"
#include "tests/gpu/child_protocol.h"
#include "tests/gpu/gpu_test_util.h"

namespace fuselink::gpu::testing {
namespace {

using IpcTest = GpuTest;

TEST_F(IpcTest, OpensAnotherProcessesAllocationWithOffsetAndSize) {
  constexpr uint64_t kAllocation = (uint64_t{16} << 20) + 4096 * 3;
  constexpr uint64_t kOffset = (uint64_t{1} << 20) + 48;
  constexpr uint64_t kSize = (uint64_t{8} << 20) + 5;
  const uint64_t seed = RandomSeed();
  auto child =
      Child::Start({"ipc-export", std::to_string(kAllocation), std::to_string(seed)});
  ASSERT_TRUE(child.ok()) << child.status();
  ChildReply reply{};
  FL_ASSERT_OK(ReceiveMessage(child->socket(), &reply, sizeof(reply)));
  ASSERT_EQ(reply.failed, 0u) << reply.error;
  IpcMemHandle handle;
  std::memcpy(handle.data(), reply.ipc_handle, handle.size());

  // A range past the allocation's end is refused, and the handle closed again.
  auto outside = IpcImport::Open(*context_, handle, kAllocation - 10, 100);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kOutOfRange) << outside.status();

  auto imported = IpcImport::Open(*context_, handle, kOffset, kSize);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_GE(imported->allocation_bytes(), kAllocation);
  EXPECT_EQ(imported->ptr(), imported->allocation_base() + kOffset);
  EXPECT_EQ(imported->size_bytes(), kSize);
  auto seen = ReadDevice(*stream_, imported->ptr(), kSize);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_TRUE(*seen == Pattern(kSize, seed, kOffset));
  FL_ASSERT_OK(imported->Close());
  FL_ASSERT_OK(imported->Close());  // idempotent

  const char done = 1;
  FL_ASSERT_OK(SendMessage(child->socket(), &done, 1));
  auto exit_status = child->Wait();
  ASSERT_TRUE(exit_status.ok()) << exit_status.status();
  EXPECT_EQ(*exit_status, 0);
}

TEST_F(IpcTest, BogusHandleIsInvalidArgumentWithTheDriversReason) {
  IpcMemHandle bogus;
  const std::vector<uint8_t> noise = Pattern(bogus.size(), RandomSeed());
  std::memcpy(bogus.data(), noise.data(), bogus.size());
  auto imported = IpcImport::Open(*context_, bogus, 0, 4096);
  ASSERT_FALSE(imported.ok());
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument)
      << imported.status();
  EXPECT_NE(imported.status().message().find("cuIpcOpenMemHandle: CUDA_ERROR_"),
            absl::string_view::npos)
      << imported.status();
  EXPECT_FALSE(ReasonOf(imported.status()).empty());
  std::printf("bogus IPC handle: %s\n", imported.status().ToString().c_str());

  IpcMemHandle zeros{};
  EXPECT_EQ(IpcImport::Open(*context_, zeros, 0, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IpcImport::Open(*context_, zeros, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fuselink::gpu::testing
