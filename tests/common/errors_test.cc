#include "agent/common/errors.h"

#include <set>
#include <string>

#include "agent/common/status_macros.h"
#include "gtest/gtest.h"

namespace fuselink {
namespace {

TEST(Reasons, TravelByTheirNameOnTheWire) {
  const absl::Status s =
      WithReason(absl::NotFoundError("no tensor"), reasons::kUnknownTensor);
  EXPECT_EQ(ReasonOf(s), "UNKNOWN_TENSOR");
  EXPECT_EQ(ReasonOf(s), reasons::kUnknownTensor);
  EXPECT_FALSE(ReasonOf(s) == reasons::kUnknownTransfer);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "no tensor");
}

TEST(Reasons, AForeignReasonIsPassedOnAsGiven) {
  const absl::Status s =
      WithForeignReason(absl::InternalError("cuMemAlloc"), "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(ReasonOf(s), "CUDA_ERROR_OUT_OF_MEMORY");
  EXPECT_EQ(ReasonOf(absl::InternalError("none")), "");
}

TEST(Reasons, TheCatalogueListsEachOnceWithItsCode) {
  std::set<absl::string_view> names;
  for (const Reason& r : kAllReasons) {
    EXPECT_TRUE(names.insert(r.name).second) << r;
    EXPECT_NE(r.code, absl::StatusCode::kOk) << r;
    EXPECT_FALSE(r.meaning.empty()) << r;
  }
  EXPECT_TRUE(names.contains("SHUTTING_DOWN"));
  EXPECT_TRUE(names.contains("CUDA_ERROR_*"));
  EXPECT_EQ(reasons::kDeadline.code, absl::StatusCode::kDeadlineExceeded);
}

// The compile-time checks of errors.h, here also at run time so that their failures
// are seen to be failures.
TEST(Reasons, ConstantsSpellTheirNames) {
  using errors_internal::ConstantNames;
  EXPECT_TRUE(ConstantNames("kUnknownTensor", "UNKNOWN_TENSOR"));
  EXPECT_TRUE(ConstantNames("kBadUtf8", "BAD_UTF8"));
  EXPECT_TRUE(ConstantNames("kCudaError", "CUDA_ERROR_*"));
  EXPECT_FALSE(ConstantNames("kUnknownTensr", "UNKNOWN_TENSOR"));
  EXPECT_FALSE(ConstantNames("kUnknownTensor", "UNKNOWN_TENSORS"));
  EXPECT_FALSE(ConstantNames("kUnknowntensor", "UNKNOWN_TENSOR"));
  EXPECT_FALSE(ConstantNames("UnknownTensor", "UNKNOWN_TENSOR"));
}

TEST(Reasons, NamesAreUpperSnakeCase) {
  using errors_internal::WellFormed;
  EXPECT_TRUE(WellFormed("NO_GPU"));
  EXPECT_TRUE(WellFormed("CUDA_ERROR_*"));
  EXPECT_FALSE(WellFormed("No_GPU"));
  EXPECT_FALSE(WellFormed("NO__GPU"));
  EXPECT_FALSE(WellFormed("_NO_GPU"));
  EXPECT_FALSE(WellFormed("NO_GPU_"));
  EXPECT_FALSE(WellFormed("NO GPU"));
  EXPECT_FALSE(WellFormed(""));
}

TEST(Reasons, OrderIsAReadersAlphabet) {
  using errors_internal::Before;
  EXPECT_TRUE(Before("NO_GPU", "NODE_MISMATCH"));
  EXPECT_TRUE(Before("WATCH_SHARE", "WATCHER_TOO_SLOW"));
  EXPECT_TRUE(Before("NO_DMABUF", "NO_DMABUF_EXPORT"));
  EXPECT_FALSE(Before("NODE_MISMATCH", "NO_GPU"));
  EXPECT_FALSE(Before("NO_GPU", "NO_GPU"));
}

TEST(WithContext, LeadsTheMessageAndKeepsCodeAndReason) {
  const absl::Status peer =
      WithReason(absl::NotFoundError("no tensor named 'kv'"), reasons::kUnknownTensor);
  const absl::Status s = WithContext(peer, "node 'b'");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "node 'b': no tensor named 'kv'");
  EXPECT_EQ(ReasonOf(s), "UNKNOWN_TENSOR");
  EXPECT_TRUE(WithContext(absl::OkStatus(), "node 'b'").ok());
}

}  // namespace
}  // namespace fuselink
