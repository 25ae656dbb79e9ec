// The harness's own logic that needs no agent: finding a sanitizer report in a log.
#include <algorithm>
#include <string>

#include "gtest/gtest.h"
#include "tests/integration/agent_process.h"

namespace fuselink::testing {
namespace {

TEST(FindSanitizerReport, NothingInACleanLog) {
  EXPECT_EQ(FindSanitizerReport(""), "");
  EXPECT_EQ(FindSanitizerReport("fuselink-agent node=node-a grpc=127.0.0.1:1\n"
                                "error: peer node-b is not reachable\n"),
            "");
}

TEST(FindSanitizerReport, EachSanitizerFromTheStartOfItsLine) {
  for (const std::string line :
       {"==12==ERROR: AddressSanitizer: heap-use-after-free on address 0x6020",
        "==12==ERROR: LeakSanitizer: detected memory leaks",
        "WARNING: ThreadSanitizer: data race (pid=12)",
        "agent/transfer/plan.cc:40:7: runtime error: signed integer overflow"}) {
    const std::string log = "started\n" + line + "\n    #0 0x1 in f\nlater\n";
    EXPECT_EQ(FindSanitizerReport(log), line + "\n    #0 0x1 in f\nlater\n") << line;
  }
}

TEST(FindSanitizerReport, AtMostItsLinesOfALongReport) {
  std::string log = "WARNING: ThreadSanitizer: data race\n";
  for (int i = 0; i < 3 * kReportLines; ++i) log += "    #" + std::to_string(i) + "\n";
  const std::string report = FindSanitizerReport(log);
  EXPECT_EQ(std::count(report.begin(), report.end(), '\n'), kReportLines);
  EXPECT_EQ(report.rfind("WARNING: ThreadSanitizer", 0), 0u);
}

}  // namespace
}  // namespace fuselink::testing
