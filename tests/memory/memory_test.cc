#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "agent/common/status_macros.h"
#include "agent/memory/fd_tokens.h"
#include "agent/memory/host_mapping.h"
#include "agent/memory/layout.h"
#include "gtest/gtest.h"

namespace fuselink::memory {
namespace {

TEST(Layout, PackedStridesAreFilledIn) {
  auto l = NormalizeLayout(Layout{4, 8, 1024, 0, 0}, 4 * 8 * 1024);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->block_stride_bytes, 1024u);
  EXPECT_EQ(l->layer_stride_bytes, 8u * 1024);
  EXPECT_EQ(l->BlockOffset(2, 3), 2u * 8192 + 3 * 1024);
  EXPECT_TRUE(l->blocks_packed());
}

TEST(Layout, StridedLayoutNeedsOnlyItsLastBlock) {
  // Blocks of 100 bytes every 128, layers every 4096: the last block ends at
  // 3 * 4096 + 7 * 128 + 100.
  const uint64_t extent = 3 * 4096 + 7 * 128 + 100;
  EXPECT_TRUE(NormalizeLayout(Layout{4, 8, 100, 128, 4096}, extent).ok());
  auto short_by_one = NormalizeLayout(Layout{4, 8, 100, 128, 4096}, extent - 1);
  EXPECT_EQ(short_by_one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(short_by_one.status()), "LAYOUT_EXCEEDS_MEMORY");
}

TEST(Layout, RejectsBadShapes) {
  for (Layout bad : {Layout{0, 1, 1, 0, 0}, Layout{1, 0, 1, 0, 0}, Layout{1, 1, 0, 0, 0},
                     Layout{2, 2, 100, 50, 0},               // blocks overlap
                     Layout{2, 4, 100, 0, 200},              // layers overlap
                     Layout{kMaxLayers + 1, 1, 1, 0, 0},     // too many layers
                     Layout{2, 2, UINT64_MAX / 2, 0, 0}}) {  // overflows
    auto l = NormalizeLayout(bad, UINT64_MAX);
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument)
        << bad.layers << "x" << bad.blocks_per_layer << "x" << bad.block_bytes;
    EXPECT_EQ(ReasonOf(l.status()), "BAD_LAYOUT");
  }
}

TEST(FdTokens, TokenIsSpentOnce) {
  FdTokens tokens;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[1]);
  auto token = tokens.Put(UniqueFd(fds[0]), Lender{true, getpid(), getuid(), getgid()});
  ASSERT_TRUE(token.ok());
  auto lent = tokens.Take(*token);
  ASSERT_TRUE(lent.ok());
  EXPECT_EQ(lent->fd.get(), fds[0]);
  EXPECT_EQ(lent->lender.pid, getpid());
  EXPECT_EQ(lent->lender.uid, getuid());
  auto again = tokens.Take(*token);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(again.status()), "BAD_FD_TOKEN");
}

TEST(HostMapping, ChecksTheFile) {
  UniqueFd fd(memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(fd.get(), 8192), 0);
  auto past_end = HostMapping::Map(UniqueFd(dup(fd.get())), 4096, 8192);
  EXPECT_EQ(ReasonOf(past_end.status()), "BAD_MEMORY");
  auto unaligned = HostMapping::Map(UniqueFd(dup(fd.get())), 100, 4096);
  EXPECT_EQ(ReasonOf(unaligned.status()), "BAD_MEMORY");
  auto ok = HostMapping::Map(std::move(fd), 4096, 4096);
  ASSERT_TRUE(ok.ok()) << ok.status();
  static_cast<uint8_t*>((*ok)->data())[4095] = 7;  // writable to its last byte
}

TEST(HostMapping, SealsTheFileAgainstShrinking) {
  UniqueFd fd(memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(fd.get(), 8192), 0);
  auto mapped = HostMapping::Map(UniqueFd(dup(fd.get())), 0, 8192);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  // The lender can no longer pull the pages out from under the agent.
  EXPECT_NE(ftruncate(fd.get(), 4096), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_TRUE(fcntl(fd.get(), F_GET_SEALS) & F_SEAL_SHRINK);
  EXPECT_EQ(ftruncate(fd.get(), 16384), 0);  // growing is harmless, and allowed
  static_cast<uint8_t*>((*mapped)->data())[8191] = 1;
}

TEST(HostMapping, RefusesWhatCannotBeSealed) {
  UniqueFd unsealable(memfd_create("t", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(unsealable.get(), 4096), 0);
  auto refused = HostMapping::Map(std::move(unsealable), 0, 4096);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(refused.status()), "UNSEALED_MEMORY");

  char path[] = "/tmp/fuselink-memory-test-XXXXXX";
  UniqueFd file(mkstemp(path));
  ASSERT_TRUE(file.valid());
  unlink(path);
  ASSERT_EQ(ftruncate(file.get(), 4096), 0);
  auto not_memfd = HostMapping::Map(std::move(file), 0, 4096);
  EXPECT_EQ(ReasonOf(not_memfd.status()), "UNSEALED_MEMORY");

  UniqueFd sealed(memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(sealed.get(), 4096), 0);
  ASSERT_EQ(fcntl(sealed.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL), 0);
  EXPECT_TRUE(HostMapping::Map(std::move(sealed), 0, 4096).ok());  // sealed by the lender
}

}  // namespace
}  // namespace fuselink::memory
