// Every thread of a live agent has a name (NameThisThread, agent/common/check.h), and
// docs/HACKING.md's table of threads lists every name fuselink gives: what `top -H`,
// `ps -L`, gdb and perf show an operator is explained there. Threads gRPC starts carry
// gRPC's names and are not checked.
#include <dirent.h>
#include <sys/types.h>

#include <cstddef>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"

namespace fuselink::testing {
namespace {

// The names of `pid`'s threads, one entry per thread.
std::multiset<std::string> ThreadNames(pid_t pid) {
  std::multiset<std::string> names;
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return names;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(absl::StrCat(tasks, "/", entry->d_name, "/comm"));
    std::string name;
    if (std::getline(comm, name)) names.insert(name);
  }
  closedir(dir);
  return names;
}

std::string Hacking() {
  std::ifstream in(FUSELINK_HACKING_MD);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Threads that keep the process's name: the main thread, and under ThreadSanitizer
// its runtime's background thread, started before main.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FL_TSAN_RUNTIME_THREAD 1
#endif
#endif
#if defined(FL_TSAN_RUNTIME_THREAD) || defined(__SANITIZE_THREAD__)
constexpr size_t kUnnamed = 2;
#else
constexpr size_t kUnnamed = 1;
#endif

class ThreadNamesTest : public TwoNodeTest {};

TEST_F(ThreadNamesTest, EveryThreadIsNamedAndEveryNameIsInTheThreadTable) {
  ASSERT_NO_FATAL_FAILURE(StartNodes());
  // One transfer, so that the fabric's connection threads and the lanes exist.
  const v1::Layout layout = MakeLayout(2, 4, 4096);
  absl::StatusOr<HostTensor> source = RegisterTensor(*a_, "kv", layout, 1);
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<HostTensor> target = RegisterTensor(*b_, "kv", layout, 2);
  ASSERT_TRUE(target.ok()) << target.status();
  const TransferResult result =
      RunTransfer(a_->stub(), MakeRequest("names", "kv", {0, 1}, "kv", {2, 3}));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();

  const std::string table = Hacking();
  ASSERT_NE(table.find("## Threads"), std::string::npos) << FUSELINK_HACKING_MD;
  for (AgentProcess* agent : {a_.get(), b_.get()}) {
    const std::multiset<std::string> names = ThreadNames(agent->pid());
    ASSERT_FALSE(names.empty()) << "no threads read for pid " << agent->pid();
    // The main thread keeps the process's name; every thread fuselink starts has its
    // own (one that kept the name would be a thread nobody named).
    EXPECT_EQ(names.count("fuselink-agent"), kUnnamed) << agent->node();
    std::set<std::string> ours;
    for (const std::string& name : names) {
      if (absl::StartsWith(name, "fl-")) ours.insert(name);
    }
    // The engine's timer and a connection's threads, at least; the source's prepare
    // lanes, which start with its first prepare.
    for (const char* expected :
         {"fl-engine-timer", "fl-tcp-tx", "fl-tcp-rx", "fl-tcp-in"}) {
      EXPECT_EQ(ours.count(expected), 1u) << agent->node() << " has no " << expected;
    }
    EXPECT_EQ(ours.count("fl-prepare"), agent == a_.get() ? 1u : 0u) << agent->node();
    // On TCP a peer's prepare is answered on gRPC's thread: that pool never starts.
    EXPECT_EQ(ours.count("fl-incoming"), 0u) << agent->node();
    for (const std::string& name : ours) {
      EXPECT_NE(table.find(absl::StrCat("`", name, "`")), std::string::npos)
          << name << " (" << agent->node() << ") is not in docs/HACKING.md's threads";
    }
  }
}

}  // namespace
}  // namespace fuselink::testing
