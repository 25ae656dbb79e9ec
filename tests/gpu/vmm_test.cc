// VMM allocations exported as POSIX fds and imported again, in this process and in
// another one (the fd crossing a socket pair with SCM_RIGHTS).
#include "agent/gpu/vmm.h"

#include <fcntl.h>
#include <unistd.h>

#include "agent/gpu/copy_kernel.h"
#include "agent/gpu/memory.h"
#include "tests/gpu/child_protocol.h"
#include "tests/gpu/gpu_test_util.h"

namespace fuselink::gpu::testing {
namespace {

class VmmTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto info = QueryDevice(*driver_, 0);
    ASSERT_TRUE(info.ok()) << info.status();
    if (!info->vmm || !info->posix_fd_handles) {
      GTEST_SKIP() << "GPU 0 lacks VMM or POSIX fd handles";
    }
    auto granule = VmmGranule(*context_);
    ASSERT_TRUE(granule.ok()) << granule.status();
    granule_ = *granule;
  }
  size_t granule_ = 0;
};

TEST_F(VmmTest, RoundsToGranule) {
  auto buffer = VmmBuffer::Create(*context_, 1);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->size_bytes(), granule_);
  EXPECT_EQ(buffer->ptr() % granule_, 0u);
}

TEST_F(VmmTest, ExportImportInThisProcessSharesMemory) {
  auto exported = VmmBuffer::Create(*context_, 3 * granule_ + 1);
  ASSERT_TRUE(exported.ok()) << exported.status();
  const size_t size = exported->size_bytes();
  auto fd = exported->ExportFd();
  ASSERT_TRUE(fd.ok()) << fd.status();
  auto imported = VmmBuffer::ImportFd(*context_, fd->get(), size);
  ASSERT_TRUE(imported.ok()) << imported.status();
  fd->reset();
  ASSERT_NE(imported->ptr(), exported->ptr());  // two mappings of one memory

  const uint64_t seed = RandomSeed();
  FL_ASSERT_OK(WriteDevice(*stream_, exported->ptr(), Pattern(size, seed)));
  auto seen = ReadDevice(*stream_, imported->ptr(), size);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_TRUE(*seen == Pattern(size, seed));

  // And the other way, stored by the copy kernel through the imported mapping.
  auto kernel = CopyKernel::Load(*context_);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  auto staging = DeviceBuffer::Allocate(*context_, size);
  ASSERT_TRUE(staging.ok()) << staging.status();
  FL_ASSERT_OK(WriteDevice(*stream_, staging->ptr(), Pattern(size, seed + 7)));
  FL_ASSERT_OK(kernel->Launch(*stream_, imported->ptr(), staging->ptr(), size));
  seen = ReadDevice(*stream_, exported->ptr(), size);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_TRUE(*seen == Pattern(size, seed + 7));
}

TEST_F(VmmTest, ImportOfSomethingElseIsInvalidArgument) {
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  ASSERT_GE(null_fd, 0);
  UniqueFd owned(null_fd);
  auto imported = VmmBuffer::ImportFd(*context_, owned.get(), granule_);
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument)
      << imported.status();
  std::printf("import of /dev/null: %s\n", imported.status().ToString().c_str());
  EXPECT_EQ(VmmBuffer::ImportFd(*context_, -1, granule_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(VmmBuffer::ImportFd(*context_, owned.get(), granule_ + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(VmmTest, ImportLargerThanExportedIsInvalidArgument) {
  auto exported = VmmBuffer::Create(*context_, granule_);
  ASSERT_TRUE(exported.ok()) << exported.status();
  auto fd = exported->ExportFd();
  ASSERT_TRUE(fd.ok()) << fd.status();
  auto imported = VmmBuffer::ImportFd(*context_, fd->get(), 4 * granule_);
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kInvalidArgument)
      << imported.status();
  std::printf("import with a size too large: %s\n", imported.status().ToString().c_str());
}

TEST_F(VmmTest, FdCrossesToAnotherProcess) {
  auto exported = VmmBuffer::Create(*context_, 5 * granule_);
  ASSERT_TRUE(exported.ok()) << exported.status();
  const size_t size = exported->size_bytes();
  const uint64_t seed = RandomSeed();
  FL_ASSERT_OK(WriteDevice(*stream_, exported->ptr(), Pattern(size, seed)));
  auto child = Child::Start({"vmm-import"});
  ASSERT_TRUE(child.ok()) << child.status();
  {
    auto fd = exported->ExportFd();
    ASSERT_TRUE(fd.ok()) << fd.status();
    const VmmRequest request{size, seed};
    FL_ASSERT_OK(SendMessage(child->socket(), &request, sizeof(request), fd->get()));
  }  // our copy of the fd closes; the child holds its own
  ChildReply reply{};
  FL_ASSERT_OK(ReceiveMessage(child->socket(), &reply, sizeof(reply)));
  ASSERT_EQ(reply.failed, 0u) << reply.error;
  auto exit_status = child->Wait();
  ASSERT_TRUE(exit_status.ok()) << exit_status.status();
  EXPECT_EQ(*exit_status, 0);
  // The child wrote through its own mapping and has exited; the bytes are in our memory.
  auto seen = ReadDevice(*stream_, exported->ptr(), size);
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_TRUE(*seen == Pattern(size, seed + 1));
}

}  // namespace
}  // namespace fuselink::gpu::testing
