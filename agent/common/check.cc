#include "agent/common/check.h"

#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fuselink {
namespace {

std::atomic<uint64_t> missed{0};
// Release builds log this many failed FL_EXPECTs; the counter keeps counting.
constexpr uint64_t kLogged = 16;
thread_local ThreadRole role = ThreadRole::kAny;

}  // namespace

void InvariantBroken(const char* file, int line, const char* condition,
                     const char* what) {
  std::fprintf(stderr, "fuselink: invariant broken at %s:%d: %s (%s)\n", file, line, what,
               condition);
  std::fflush(stderr);
  std::abort();
}

void InvariantMissed(const char* file, int line, const char* condition,
                     const char* what) {
  if (missed.fetch_add(1, std::memory_order_relaxed) < kLogged) {
    std::fprintf(stderr, "fuselink: invariant missed at %s:%d: %s (%s)\n", file, line,
                 what, condition);
  }
}

uint64_t InvariantFailures() { return missed.load(std::memory_order_relaxed); }

void SetThreadRole(ThreadRole r) { role = r; }
ThreadRole CurrentThreadRole() { return role; }

void NameThisThread(const char* name) {
  FL_DCHECK(std::strlen(name) <= 15, "a thread name longer than the kernel keeps");
  pthread_setname_np(pthread_self(), name);
}

}  // namespace fuselink
