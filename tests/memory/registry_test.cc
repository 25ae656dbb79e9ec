// The registry's shares per owner (OwnerShares) and its listing by owner, over a fake
// fabric with made-up device addresses (nothing reads the memory here).
#include "agent/memory/registry.h"

#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "agent/common/status_macros.h"
#include "gtest/gtest.h"
#include "tests/transfer/fakes.h"

namespace fuselink::memory {
namespace {

constexpr uint32_t kLayers = 2, kBlocks = 4;
constexpr uint64_t kBlockBytes = 4096;
constexpr uint64_t kTensorBytes = kLayers * kBlocks * kBlockBytes;

Layout Strided() { return Layout(kLayers, kBlocks, kBlockBytes); }
// Two parts per block in each layer: 4 layout parts, one after another.
Layout FourParts() {
  std::vector<Part> parts;
  for (uint64_t i = 0; i < 4; ++i) {
    parts.push_back(Part{.region = 0,
                         .offset = i * kBlocks * (kBlockBytes / 2),
                         .block_stride = 0,
                         .bytes = kBlockBytes / 2});
  }
  return Layout(kLayers, kBlocks, 0, 0, 0, 2, std::move(parts));
}

class RegistryShareTest : public ::testing::Test {
 protected:
  RegistryShareTest()
      : fabric_(1), registry_(&fabric_, {.max_tensors = 2, .max_layout_parts = 6}) {}

  // Each tensor at its own made-up address: no two alias.
  absl::StatusOr<TensorInfo> Register(const std::string& owner, const std::string& name,
                                      const Layout& layout = Strided(),
                                      UniqueFd lender = UniqueFd()) {
    TensorInfo want;
    want.name = name;
    want.owner = owner;
    want.layout = layout;
    want.memory_kind = "vmm";
    const uint64_t address = 0x7f0000000000ull + (next_++) * (uint64_t{1} << 20);
    return registry_.RegisterGpu(std::move(want), address, 0, kTensorBytes,
                                 std::make_shared<int>(0), std::move(lender));
  }
  std::vector<std::string> Names(absl::string_view after, size_t limit, bool* more,
                                 std::optional<absl::string_view> owner) {
    std::vector<std::string> names;
    for (const auto& info : registry_.List(after, limit, more, owner)) {
      names.push_back(info->name);
    }
    return names;
  }

  transfer::testing::FakeFabric fabric_;
  Registry registry_;
  uint64_t next_ = 0;
};

TEST_F(RegistryShareTest, EachOwnerHoldsItsShareOfTensors) {
  ASSERT_TRUE(Register("a", "a1").ok());
  ASSERT_TRUE(Register("a", "a2").ok());
  absl::StatusOr<TensorInfo> over = Register("a", "a3");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(over.status()), "TENSOR_SHARE");
  EXPECT_EQ(registry_.share_refusals().tensors, 1u);
  EXPECT_TRUE(Register("b", "b1").ok());  // another owner's share
  ASSERT_TRUE(registry_.Unregister("a1").ok());
  EXPECT_TRUE(Register("a", "a3").ok());  // given back
  EXPECT_EQ(registry_.share_refusals().tensors, 1u);
  EXPECT_EQ(registry_.share_refusals().layout_parts, 0u);
}

TEST_F(RegistryShareTest, EachOwnerHoldsItsShareOfLayoutParts) {
  ASSERT_TRUE(Register("a", "p1", FourParts()).ok());
  absl::StatusOr<TensorInfo> over = Register("a", "p2", FourParts());  // 8 > 6
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(over.status()), "LAYOUT_PART_SHARE");
  EXPECT_EQ(registry_.share_refusals().layout_parts, 1u);
  EXPECT_TRUE(Register("a", "strided").ok());  // holds no layout part
  EXPECT_TRUE(Register("b", "p2", FourParts()).ok());
  ASSERT_TRUE(registry_.Unregister("p1").ok());
  EXPECT_TRUE(Register("a", "p3", FourParts()).ok());
}

// A tensor whose lending process exited is taken out: its owner's share comes back.
TEST_F(RegistryShareTest, ATensorWhoseLenderExitedGivesItsShareBack) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, child, 0)));
  ASSERT_GE(pidfd.get(), 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // exited: its pidfd polls readable
  ASSERT_TRUE(Register("a", "gone", FourParts(), std::move(pidfd)).ok());
  ASSERT_TRUE(Register("a", "kept").ok());
  EXPECT_EQ(ReasonOf(Register("a", "over").status()), "TENSOR_SHARE");
  ASSERT_EQ(registry_.TakeExitedOwners().size(), 1u);
  EXPECT_TRUE(Register("a", "p", FourParts()).ok());  // a tensor and 4 parts back
}

TEST_F(RegistryShareTest, ListingByOwnerWalksOnlyThatOwnersTensors) {
  ASSERT_TRUE(Register("a", "x").ok());
  ASSERT_TRUE(Register("b", "m").ok());
  ASSERT_TRUE(Register("a", "c").ok());
  bool more = false;
  EXPECT_EQ(Names("", 10, &more, "a"), (std::vector<std::string>{"c", "x"}));
  EXPECT_FALSE(more);
  EXPECT_EQ(Names("", 1, &more, "a"), std::vector<std::string>{"c"});
  EXPECT_TRUE(more);
  EXPECT_EQ(Names("c", 1, &more, "a"), std::vector<std::string>{"x"});
  EXPECT_FALSE(more);
  EXPECT_EQ(Names("", 10, &more, "nobody"), std::vector<std::string>{});
  EXPECT_FALSE(more);
  EXPECT_EQ(Names("", 10, &more, std::nullopt),
            (std::vector<std::string>{"c", "m", "x"}));
  // What a listing returned stays readable after the tensor is gone.
  std::vector<std::shared_ptr<const TensorInfo>> listed =
      registry_.List("", 10, &more, "b");
  ASSERT_EQ(listed.size(), 1u);
  ASSERT_TRUE(registry_.Unregister("m").ok());
  EXPECT_EQ(listed[0]->name, "m");
  EXPECT_EQ(Names("", 10, &more, "b"), std::vector<std::string>{});
}

}  // namespace
}  // namespace fuselink::memory
