// The decisions of the CUDA IPC import table without a GPU: SharedImports over a
// stand-in import that counts its opens and closes. One owner shares its import
// across regions; another owner (identity or lending process) is refused and gets
// nothing of it; the import closes when its owner lets go; a closing import is
// waited for within the bound, then refused.
#include "agent/node/ipc_imports.h"

#include <atomic>
#include <memory>
#include <optional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace fuselink::services {
namespace {

// Far past any wait that should end; only a hang reaches it.
constexpr absl::Duration kGenerous = absl::Seconds(30);

struct Counts {
  std::atomic<int> opened{0};
  std::atomic<int> closed{0};
};

// Stands in for gpu::IpcImport: what matters here is when it opens and closes. A
// close may be held back (by `hold_close`) to keep it "being closed".
struct FakeImport {
  explicit FakeImport(Counts* counts) : counts(counts) { ++counts->opened; }
  ~FakeImport() {
    if (closing != nullptr) closing->Notify();
    if (hold_close != nullptr) hold_close->WaitForNotificationWithTimeout(kGenerous);
    ++counts->closed;
  }
  Counts* counts;
  absl::Notification* closing = nullptr;
  absl::Notification* hold_close = nullptr;
};

using Imports = SharedImports<FakeImport>;
const Imports::Key kHandle{0, std::string(64, '\x11')};
const ImportOwner kEngineA{.identity = "spiffe://fuselink/engine/a", .pid = 100};
const ImportOwner kEngineB{.identity = "spiffe://fuselink/engine/b", .pid = 200};

class IpcImportsTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::shared_ptr<const FakeImport>> Open(
      Imports& imports, const ImportOwner& owner, const Imports::Key& key = kHandle) {
    return imports.Open(key, owner, [&]() -> absl::StatusOr<std::unique_ptr<FakeImport>> {
      return std::make_unique<FakeImport>(&counts_);
    });
  }
  Counts counts_;
};

TEST_F(IpcImportsTest, OneOwnerSharesItsImportAcrossRegionsAndItClosesWithTheLast) {
  Imports imports;
  auto first = Open(imports, kEngineA);
  auto second = Open(imports, kEngineA);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->get(), second->get());
  EXPECT_EQ(counts_.opened, 1);
  first->reset();
  EXPECT_EQ(counts_.closed, 0) << "closed while a region still holds it";
  second->reset();
  EXPECT_EQ(counts_.closed, 1);
  // Opened anew afterwards, not a stale entry.
  auto again = Open(imports, kEngineA);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(counts_.opened, 2);
}

TEST_F(IpcImportsTest, AnotherIdentityIsRefusedAndGetsNothingOfTheFirstsImport) {
  Imports imports;
  auto a = Open(imports, kEngineA);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Open(imports, kEngineB);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kPermissionDenied) << b.status();
  EXPECT_EQ(ReasonOf(b.status()), "GPU_HANDLE_OWNED");
  EXPECT_EQ(counts_.opened, 1) << "the second owner's open reached the driver";
  EXPECT_EQ(imports.refusals().owned, 1u);
  // The owner lets go: its import closes at once, whoever asked for it.
  a->reset();
  EXPECT_EQ(counts_.closed, 1);
}

TEST_F(IpcImportsTest, AnotherProcessOfTheSameIdentityIsAnotherOwner) {
  Imports imports;
  auto a = Open(imports, kEngineA);
  ASSERT_TRUE(a.ok()) << a.status();
  ImportOwner other_process = kEngineA;
  other_process.pid = 101;
  auto b = Open(imports, other_process);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kPermissionDenied) << b.status();
  EXPECT_EQ(ReasonOf(b.status()), "GPU_HANDLE_OWNED");
  // Under --plaintext every identity is empty: the process still tells owners apart.
  ImportOwner plain_a{.identity = "", .pid = 100};
  ImportOwner plain_b{.identity = "", .pid = 200};
  const Imports::Key other_handle{0, std::string(64, '\x22')};
  auto pa = Open(imports, plain_a, other_handle);
  ASSERT_TRUE(pa.ok()) << pa.status();
  auto pb = Open(imports, plain_b, other_handle);
  EXPECT_EQ(ReasonOf(pb.status()), "GPU_HANDLE_OWNED") << pb.status();
}

TEST_F(IpcImportsTest, OnceTheOwnerLetsGoAnotherMayLendTheHandleAsItsOwn) {
  Imports imports;
  auto a = Open(imports, kEngineA);
  ASSERT_TRUE(a.ok()) << a.status();
  a->reset();
  auto b = Open(imports, kEngineB);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(counts_.opened, 2) << "the second owner got the first's import";
  // And now the first is the other owner.
  auto a_again = Open(imports, kEngineA);
  EXPECT_EQ(ReasonOf(a_again.status()), "GPU_HANDLE_OWNED") << a_again.status();
}

TEST_F(IpcImportsTest, TheSameHandleOnAnotherGpuIsAnotherImport) {
  Imports imports;
  auto a = Open(imports, kEngineA);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Open(imports, kEngineB, Imports::Key{1, kHandle.second});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->get(), b->get());
}

TEST_F(IpcImportsTest, AFailedOpenLeavesNothingBehind) {
  Imports imports;
  auto refused = imports.Open(kHandle, kEngineA,
                              []() -> absl::StatusOr<std::unique_ptr<FakeImport>> {
                                return absl::InvalidArgumentError("invalid handle");
                              });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  // Nobody holds it: another owner may open it.
  auto b = Open(imports, kEngineB);
  ASSERT_TRUE(b.ok()) << b.status();
}

// The last holder let go and the close is under way (held back here): an Open of the
// same handle waits for it, at most the close wait, then is UNAVAILABLE.
TEST_F(IpcImportsTest, AnImportBeingClosedIsWaitedForWithinTheBound) {
  Imports imports(absl::Milliseconds(1));
  absl::Notification closing, hold_close;
  auto a = Open(imports, kEngineA);
  ASSERT_TRUE(a.ok()) << a.status();
  auto& import = const_cast<FakeImport&>(**a);
  import.closing = &closing;
  import.hold_close = &hold_close;
  std::thread releaser([held = std::move(*a)]() mutable { held.reset(); });
  ASSERT_TRUE(closing.WaitForNotificationWithTimeout(kGenerous));
  for (const ImportOwner& owner : {kEngineA, kEngineB}) {
    auto during = Open(imports, owner);
    EXPECT_EQ(during.status().code(), absl::StatusCode::kUnavailable) << during.status();
    EXPECT_EQ(ReasonOf(during.status()), "GPU_HANDLE_CLOSING");
  }
  EXPECT_EQ(imports.refusals().closing, 2u);
  hold_close.Notify();
  releaser.join();
  EXPECT_EQ(counts_.closed, 1);
  auto after = Open(imports, kEngineB);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(counts_.opened, 2);
}

// With time to wait, an Open that finds the import closing gets a fresh one once
// the close is done, not a refusal and not the closed import.
TEST_F(IpcImportsTest, AnOpenDuringACloseGetsAFreshImportOnceItIsDone) {
  Imports imports(kGenerous);
  absl::Notification closing, hold_close;
  auto a = Open(imports, kEngineA);
  ASSERT_TRUE(a.ok()) << a.status();
  auto& import = const_cast<FakeImport&>(**a);
  import.closing = &closing;
  import.hold_close = &hold_close;
  std::thread releaser([held = std::move(*a)]() mutable { held.reset(); });
  ASSERT_TRUE(closing.WaitForNotificationWithTimeout(kGenerous));
  std::optional<absl::StatusOr<std::shared_ptr<const FakeImport>>> during;
  std::thread opener([&] { during = Open(imports, kEngineB); });
  hold_close.Notify();
  opener.join();
  releaser.join();
  ASSERT_TRUE(during->ok()) << during->status();
  EXPECT_EQ(counts_.opened, 2);
  EXPECT_EQ(counts_.closed, 1);
}

}  // namespace
}  // namespace fuselink::services
