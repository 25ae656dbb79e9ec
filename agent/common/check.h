// Invariants that run. Each names a condition the code relies on, in three strengths:
//  - FL_CHECK(cond, what): always on. A broken invariant aborts with the file, the
//    line and `what`: for conditions whose failure would place a byte where no live
//    transfer prepared for it, or free memory a write still reads.
//  - FL_DCHECK(cond, what): in checking builds only (FUSELINK_DCHECK: the sanitized
//    builds and Debug, so every test runs them under CI); compiled out, `cond`
//    unevaluated, elsewhere. For the hot path's pre- and postconditions.
//  - FL_EXPECT(cond, what): a checking build aborts; a release build logs the first
//    few and counts every one (InvariantFailures(), on /metrics as
//    fuselink_invariant_failures_total) and goes on. For conditions whose failure
//    costs a transfer, not memory safety.
// No check may stand in for validating what a peer, an engine or a client sent: those
// are errors with reasons. These are about the agent's own code.
//
// Thread roles make "never blocks" and "one caller at a time" checkable: a thread
// that must not block (a fabric poller or connection thread) says so once, and code
// that may block asserts FL_MAY_BLOCK().
#pragma once

#include <cstdint>

namespace fuselink {

[[noreturn]] void InvariantBroken(const char* file, int line, const char* condition,
                                  const char* what);
// Logs (the first few) and counts a failed FL_EXPECT in a release build.
void InvariantMissed(const char* file, int line, const char* condition, const char* what);
// FL_EXPECT failures counted since start.
uint64_t InvariantFailures();

enum class ThreadRole : uint8_t {
  kAny,     // may block
  kFabric,  // a fabric's poller or connection thread: never blocks on a peer or a lock
            // held across a call
  kHousekeeping,  // a Housekeeper that never blocks (housekeeper.h): one slow task
                  // delays every other
  kPollLoop,      // one poll(2) loop serving many clients (the /metrics server, the
                  // handle socket): one blocking call stalls every client
};
// The calling thread's role from now on.
void SetThreadRole(ThreadRole role);
ThreadRole CurrentThreadRole();
// Names the calling thread as top -H, ps -L, gdb and perf show it: "fl-" and what it
// is, 15 characters at most (the kernel's limit). docs/HACKING.md's table of threads
// lists every name; tests/integration/thread_names_test.cc checks a live agent's.
void NameThisThread(const char* name);

}  // namespace fuselink

#define FL_CHECK(cond, what)                                                   \
  do {                                                                         \
    if (!(cond)) ::fuselink::InvariantBroken(__FILE__, __LINE__, #cond, what); \
  } while (0)

#ifdef FUSELINK_DCHECK
#define FL_DCHECK(cond, what) FL_CHECK(cond, what)
#define FL_EXPECT(cond, what) FL_CHECK(cond, what)
#else
#define FL_DCHECK(cond, what) \
  do {                        \
    if (false && (cond)) {    \
    }                         \
  } while (0)
#define FL_EXPECT(cond, what)                                                  \
  do {                                                                         \
    if (!(cond)) ::fuselink::InvariantMissed(__FILE__, __LINE__, #cond, what); \
  } while (0)
#endif

// Code that may block (a peer call, a join, a wait on a condition another thread
// satisfies) is never run on a fabric or a never-blocking housekeeping thread.
#define FL_MAY_BLOCK()                                                       \
  FL_DCHECK(::fuselink::CurrentThreadRole() == ::fuselink::ThreadRole::kAny, \
            "code that may block runs on a thread that must not block")
