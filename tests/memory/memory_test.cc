#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "absl/strings/str_format.h"
#include "agent/common/status_macros.h"
#include "agent/memory/fd_tokens.h"
#include "agent/memory/host_mapping.h"
#include "agent/memory/layout.h"
#include "agent/memory/memory_extent.h"
#include "gtest/gtest.h"

namespace fuselink::memory {
namespace {

TEST(Layout, PackedStridesAreFilledIn) {
  auto l = NormalizeLayout(Layout{4, 8, 1024, 0, 0}, 4 * 8 * 1024);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->block_stride_bytes, 1024u);
  EXPECT_EQ(l->layer_stride_bytes, 8u * 1024);
  EXPECT_EQ(l->PartOffset(2, 0, 3), 2u * 8192 + 3 * 1024);
  EXPECT_EQ(l->part_count(), 1u);
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

// An engine's KV cache as vLLM allocates it: one region per layer holding
// [2, blocks, ...], K in the first half and V in the second.
Layout PerLayer(uint32_t layers, uint32_t blocks, uint64_t part) {
  Layout l{layers, blocks, 0, 0, 0, 2};
  for (uint32_t r = 0; r < layers; ++r) {
    l.parts.push_back(Part{r, 0, 0, part});
    l.parts.push_back(Part{r, blocks * part, 0, part});
  }
  return l;
}

absl::Status Refusal(const Layout& layout, const std::vector<uint64_t>& regions) {
  return NormalizeLayout(layout, regions).status();
}

TEST(LayoutParts, PerLayerKvIsOneTensorOfManyRegions) {
  auto l = NormalizeLayout(PerLayer(3, 8, 256), std::vector<uint64_t>(3, 2 * 8 * 256));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->block_bytes, 512u);  // filled in: K and V
  EXPECT_EQ(l->part_count(), 2u);
  EXPECT_EQ(l->part(1, 1).block_stride, 256u);
  // Block 5's V part of layer 2: region 2, after the 8 K parts.
  EXPECT_EQ(l->PartOffset(2, 1, 5), TensorOffset(2, 8 * 256 + 5 * 256));
  EXPECT_EQ(RegionOf(l->PartOffset(2, 1, 5)), 2u);
  EXPECT_EQ(OffsetInRegion(l->PartOffset(2, 1, 5)), 13u * 256);
}

TEST(LayoutParts, InterleavedPartsOfOneStrideFit) {
  // K and V of a block side by side, blocks every 512 bytes: [blocks, 2, ...].
  Layout l{1, 4, 0, 0, 0, 2, {Part{0, 0, 512, 256}, Part{0, 256, 512, 256}}};
  EXPECT_TRUE(NormalizeLayout(l, 4 * 512).ok());
  l.parts[1].offset = 128;  // V now starts inside K
  EXPECT_EQ(ReasonOf(Refusal(l, {4 * 512})), "BAD_LAYOUT");
}

TEST(LayoutParts, EachInconsistencyIsNamed) {
  const std::vector<uint64_t> three(3, 2 * 8 * 256);
  struct Case {
    const char* what;
    Layout layout;
    std::vector<uint64_t> regions;
    const char* reason;
  };
  std::vector<Case> cases;
  auto with = [&](const char* what, auto change, const char* reason = "BAD_LAYOUT",
                  std::vector<uint64_t> regions = {}) {
    Layout l = PerLayer(3, 8, 256);
    change(l);
    cases.push_back({what, l, regions.empty() ? three : regions, reason});
  };
  with(
      "a part past its region", [](Layout& l) { l.parts[5].offset += 1; },
      "LAYOUT_EXCEEDS_MEMORY");
  with("a region too small", [](Layout&) {}, "LAYOUT_EXCEEDS_MEMORY",
       {2 * 8 * 256, 2 * 8 * 256 - 1, 2 * 8 * 256});
  with("a region nobody uses", [](Layout&) {}, "BAD_LAYOUT",
       {2 * 8 * 256, 2 * 8 * 256, 2 * 8 * 256, 4096});
  with("an unknown region", [](Layout& l) { l.parts[0].region = 7; });
  with("parts that overlap", [](Layout& l) { l.parts[1].offset = 7 * 256; });
  with("parts in two layers that overlap", [](Layout& l) { l.parts[2].region = 0; });
  with("a layer whose parts sum to another size", [](Layout& l) {
    l.parts[3].bytes = 128;
    l.parts[3].block_stride = 256;
  });
  with("a stride under the part", [](Layout& l) { l.parts[0].block_stride = 100; });
  with("an empty part", [](Layout& l) { l.parts[0].bytes = 0; });
  with("too few parts", [](Layout& l) { l.parts.pop_back(); });
  with("block strides beside parts", [](Layout& l) { l.block_stride_bytes = 512; });
  with("no parts_per_block", [](Layout& l) { l.parts_per_block = 0; });
  with("too many parts per block", [](Layout& l) { l.parts_per_block = 17; });
  with("a part that overflows", [](Layout& l) { l.parts[0].offset = UINT64_MAX - 10; });
  for (const Case& c : cases) {
    const absl::Status s = Refusal(c.layout, c.regions);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_EQ(ReasonOf(s), c.reason) << c.what << ": " << s;
  }
  // A strided layout names one region.
  EXPECT_EQ(ReasonOf(Refusal(Layout{1, 1, 8, 0, 0}, {8, 8})), "BAD_LAYOUT");
  EXPECT_EQ(ReasonOf(Refusal(Layout{1, 1, 8, 0, 0, 2}, {8})), "BAD_LAYOUT");
}

TEST(LayoutParts, ManyInterleavedPartsAreRefusedNotSearched) {
  // 65 parts of one stride interleaved in one region: refused without pairwise work.
  // One part per layer, 65 layers, every part in region 0 every 65 * 8 bytes.
  Layout l{65, 2, 0, 0, 0, 1};
  for (uint32_t i = 0; i < 65; ++i) l.parts.push_back(Part{0, i * 8, 65 * 8, 8});
  const absl::Status s = Refusal(l, {2 * 65 * 8});
  EXPECT_EQ(ReasonOf(s), "BAD_LAYOUT");
  EXPECT_NE(s.message().find("interleave"), absl::string_view::npos) << s;
  l.layers = 64;
  l.parts.pop_back();
  EXPECT_TRUE(NormalizeLayout(l, std::vector<uint64_t>{2 * 65 * 8}).ok());
}

TEST(LayoutParts, RegionsNamed) {
  EXPECT_EQ(RegionsNamed(Layout{1, 1, 8, 0, 0}), 1u);
  EXPECT_EQ(RegionsNamed(PerLayer(5, 2, 8)), 5u);
  Layout far = PerLayer(1, 2, 8);
  far.parts[0].region = kMaxRegions;
  EXPECT_EQ(RegionsNamed(far), 0u);
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

// The VmFlags line of this process's mapping that starts at `start` ("" if none).
std::string VmFlagsOf(const void* start) {
  std::ifstream smaps("/proc/self/smaps");
  const std::string prefix = absl::StrFormat("%x-", reinterpret_cast<uintptr_t>(start));
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind(prefix, 0) == 0) in = true;
    if (in && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(HostMapping, AdvisesHugePagesBeforeItPopulates) {
  // Whether the kernel then makes them huge is the node's choice (shmem_enabled);
  // the advice itself is on the mapping whatever that choice is.
  UniqueFd fd(memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(ftruncate(fd.get(), 4 << 20), 0);
  auto mapped = HostMapping::Map(std::move(fd), 0, 4 << 20);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const std::string flags = VmFlagsOf((*mapped)->data());
  ASSERT_FALSE(flags.empty()) << "no mapping at " << (*mapped)->data();
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
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

TEST(HostMapping, RefusesMemorySealedAgainstWrites) {
  for (int seal : {F_SEAL_FUTURE_WRITE, F_SEAL_WRITE}) {
    SCOPED_TRACE(seal);
    UniqueFd fd(memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(ftruncate(fd.get(), 4096), 0);
    ASSERT_EQ(fcntl(fd.get(), F_ADD_SEALS, seal), 0);
    auto refused = HostMapping::Map(std::move(fd), 0, 4096);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(ReasonOf(refused.status()), "WRITE_SEALED_MEMORY");
  }
}

}  // namespace
}  // namespace fuselink::memory

namespace fuselink::memory {
namespace {

TEST(MemoryExtentTest, OverlapIsSharingAByteOfOneFileOrOfTheAddressSpace) {
  const std::array<uint64_t, 2> f{7, 42}, g{7, 43};
  auto at = [](std::array<uint64_t, 2> file, uint64_t begin, uint64_t bytes) {
    return MemoryExtent{.file = file, .begin = begin, .bytes = bytes};
  };
  // One file: touching is not sharing; one byte in common is.
  EXPECT_FALSE(Overlap({at(f, 0, 100)}, {at(f, 100, 50)}));
  EXPECT_TRUE(Overlap({at(f, 0, 101)}, {at(f, 100, 50)}));
  EXPECT_TRUE(Overlap({at(f, 120, 10)}, {at(f, 100, 50)}));  // inside
  // The same offsets of another file, or of the address space, are other memory.
  EXPECT_FALSE(Overlap({at(f, 0, 100)}, {at(g, 0, 100)}));
  EXPECT_FALSE(Overlap({at(f, 0, 100)}, {at({0, 0}, 0, 100)}));
  EXPECT_TRUE(Overlap({at({0, 0}, 4096, 10)}, {at({0, 0}, 4100, 1)}));
  // Many extents in any order, the shared one last in both lists.
  std::vector<MemoryExtent> a, b;
  for (uint64_t i = 0; i < 1000; ++i) {
    a.push_back(at(f, (999 - i) * 200, 100));  // even hundreds
    b.push_back(at(f, i * 200 + 100, 100));    // odd hundreds
  }
  EXPECT_FALSE(Overlap(a, b));
  b.push_back(at(g, 0, 1));
  a.push_back(at(g, 0, 1));
  EXPECT_TRUE(Overlap(a, b));
  // An extent of one list that spans several of the other's.
  EXPECT_TRUE(Overlap({at(f, 0, 10), at(f, 5, 1000)}, {at(f, 500, 1)}));
  EXPECT_FALSE(Overlap({}, {at(f, 0, 1)}));
  EXPECT_FALSE(Overlap({at(f, 0, 0)}, {at(f, 0, 1)}));  // no bytes, nothing shared
}

}  // namespace
}  // namespace fuselink::memory

namespace fuselink::memory {
namespace {

TEST(MemoryExtentTest, SharedWithinFindsTwoRegionsOfOneMemory) {
  const std::array<uint64_t, 2> f{7, 42}, g{7, 43};
  auto at = [](std::array<uint64_t, 2> file, uint64_t begin, uint64_t bytes) {
    return MemoryExtent{.file = file, .begin = begin, .bytes = bytes};
  };
  // One memfd lent twice over the same range: regions 0 and 2 are one memory.
  EXPECT_EQ(SharedWithin({at(f, 0, 4096), at(g, 0, 4096), at(f, 0, 4096)}),
            (std::pair<size_t, size_t>{0, 2}));
  // Overlapping ranges of one file, in any order; one inside a longer one.
  EXPECT_EQ(SharedWithin({at(f, 8192, 4096), at(f, 4096, 4097)}),
            (std::pair<size_t, size_t>{0, 1}));
  EXPECT_EQ(SharedWithin({at(f, 0, 1 << 20), at(f, 4096, 10), at(f, 8192, 10)}),
            (std::pair<size_t, size_t>{0, 1}));
  // Addresses (GPU memory) compare the same way.
  EXPECT_TRUE(SharedWithin({at({0, 0}, 4096, 10), at({0, 0}, 4100, 1)}).has_value());
  // Apart: adjacent ranges of one file, the same range of two files, empty extents.
  EXPECT_FALSE(SharedWithin({at(f, 0, 4096), at(f, 4096, 4096)}).has_value());
  EXPECT_FALSE(SharedWithin({at(f, 0, 4096), at(g, 0, 4096)}).has_value());
  EXPECT_FALSE(SharedWithin({at(f, 0, 0), at(f, 0, 4096)}).has_value());
  EXPECT_FALSE(SharedWithin({}).has_value());
  // Many regions, the clash between the first and the last lent.
  std::vector<MemoryExtent> many;
  for (uint64_t i = 0; i < 1000; ++i) many.push_back(at(f, i * 8192, 4096));
  EXPECT_FALSE(SharedWithin(many).has_value());
  many.push_back(at(f, 4095, 2));
  EXPECT_EQ(SharedWithin(many), (std::pair<size_t, size_t>{0, 1000}));
}

}  // namespace
}  // namespace fuselink::memory
