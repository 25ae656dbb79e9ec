// ThreadSanitizer and Debian's abseil. libabsl_synchronization is built without TSan,
// so TSan never sees absl::Mutex lock or unlock: every access that a Mutex orders
// looks like a race to it (a two-thread counter under absl::MutexLock is reported).
// Suppressing those would hide every real race in fuselink's code too.
//
// Instead, every executable of a TSan build (FUSELINK_SANITIZE=thread) links this
// file, which defines absl::Mutex's and absl::CondVar's locking functions itself. An
// executable's definition interposes a shared library's for every caller, gRPC's and
// abseil's own included; each one here tells TSan what the call does, with the mutex
// annotations of <sanitizer/tsan_interface.h> that abseil's own TSan build places
// inside mutex.cc, around a call to the library's definition (dlsym RTLD_NEXT).
//
// Between a pre and a post annotation TSan ignores memory accesses, so the waiters'
// conditions that abseil evaluates inside Lock, Unlock and Await are not reported.
// Await and CondVar::Wait are modelled as an unlock followed by a lock, which is what
// they do; both assume the caller holds the mutex exclusively (no code here awaits
// under a reader lock). Not built into any other build.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define FL_STRINGIFY_INNER(x) #x
#define FL_STRINGIFY(x) FL_STRINGIFY_INNER(x)

// The library's definition of the function whose mangled name is
// <head>4absl<inline namespace><rest> (head: _ZN, or _ZNK for a const member);
// aborts, naming it, when there is none.
void* Real(const char* rest, const char* head = "_ZN") {
  const std::string ns = FL_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name =
      std::string(head) + "4absl" + std::to_string(ns.size()) + ns + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "absl_mutex_annotations: no %s in the loaded libraries\n",
                 name.c_str());
    std::abort();
  }
  return fn;
}

// Calls that the library's own functions make come back here through the PLT;
// only a thread's outermost call is annotated.
thread_local int depth = 0;

class Outermost {
 public:
  Outermost() : annotate_(depth++ == 0) {}
  ~Outermost() { --depth; }
  bool operator()() const { return annotate_; }

 private:
  const bool annotate_;
};

// Calls `real`, a member function of Self taking Args, as the ABI passes it. Args
// are always given explicitly: deduced, a `const Condition&` would become a copy.
template <typename R, typename Self, typename... Args>
R Call(void* real, Self* self, Args... args) {
  return reinterpret_cast<R (*)(Self*, Args...)>(real)(self, args...);
}

// A lock: pre, the library's call, post. `flags` says reader or writer.
template <typename R, typename... Args>
R Locking(unsigned flags, void* real, absl::Mutex* mu, Args... args) {
  Outermost outermost;
  if (outermost()) __tsan_mutex_pre_lock(mu, flags);
  if constexpr (std::is_void_v<R>) {
    Call<void, absl::Mutex, Args...>(real, mu, args...);
    if (outermost()) __tsan_mutex_post_lock(mu, flags, 0);
  } else {
    const R r = Call<R, absl::Mutex, Args...>(real, mu, args...);
    if (outermost()) __tsan_mutex_post_lock(mu, flags, 0);
    return r;
  }
}

void Unlocking(unsigned flags, void* real, absl::Mutex* mu) {
  Outermost outermost;
  if (outermost()) __tsan_mutex_pre_unlock(mu, flags);
  Call<void>(real, mu);
  if (outermost()) __tsan_mutex_post_unlock(mu, flags);
}

bool TryLocking(unsigned flags, void* real, absl::Mutex* mu) {
  Outermost outermost;
  flags |= __tsan_mutex_try_lock;
  if (outermost()) __tsan_mutex_pre_lock(mu, flags);
  const bool locked = Call<bool>(real, mu);
  if (outermost()) {
    __tsan_mutex_post_lock(mu, locked ? flags : flags | __tsan_mutex_try_lock_failed, 0);
  }
  return locked;
}

// Await and CondVar::Wait: `mu`, held exclusively, is let go and taken again before
// the call returns.
template <typename R, typename Self, typename... Args>
R Waiting(void* real, absl::Mutex* mu, Self* self, Args... args) {
  Outermost outermost;
  if (outermost()) {
    __tsan_mutex_pre_unlock(mu, 0);
    __tsan_mutex_post_unlock(mu, 0);
    __tsan_mutex_pre_lock(mu, 0);
  }
  if constexpr (std::is_void_v<R>) {
    Call<void, Self, Args...>(real, self, args...);
    if (outermost()) __tsan_mutex_post_lock(mu, 0, 0);
  } else {
    const R r = Call<R, Self, Args...>(real, self, args...);
    if (outermost()) __tsan_mutex_post_lock(mu, 0, 0);
    return r;
  }
}

constexpr unsigned kWrite = 0;
constexpr unsigned kRead = __tsan_mutex_read_lock;
using Cond = const absl::Condition&;

}  // namespace

// Each function finds the library's definition once (a function-local static).
#define FL_REAL(rest) static void* const real = Real(rest)
#define FL_REAL_CONST(rest) static void* const real = Real(rest, "_ZNK")

namespace absl {

void Mutex::Lock() {
  FL_REAL("5Mutex4LockEv");
  Locking<void>(kWrite, real, this);
}
void Mutex::ReaderLock() {
  FL_REAL("5Mutex10ReaderLockEv");
  Locking<void>(kRead, real, this);
}
void Mutex::Unlock() {
  FL_REAL("5Mutex6UnlockEv");
  Unlocking(kWrite, real, this);
}
void Mutex::ReaderUnlock() {
  FL_REAL("5Mutex12ReaderUnlockEv");
  Unlocking(kRead, real, this);
}
bool Mutex::TryLock() {
  FL_REAL("5Mutex7TryLockEv");
  return TryLocking(kWrite, real, this);
}
bool Mutex::ReaderTryLock() {
  FL_REAL("5Mutex13ReaderTryLockEv");
  return TryLocking(kRead, real, this);
}

void Mutex::LockWhen(Cond cond) {
  FL_REAL("5Mutex8LockWhenERKNS0_9ConditionE");
  Locking<void, Cond>(kWrite, real, this, cond);
}
bool Mutex::LockWhenWithTimeout(Cond cond, Duration timeout) {
  FL_REAL("5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking<bool, Cond, Duration>(kWrite, real, this, cond, timeout);
}
bool Mutex::LockWhenWithDeadline(Cond cond, Time deadline) {
  FL_REAL("5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking<bool, Cond, Time>(kWrite, real, this, cond, deadline);
}
void Mutex::ReaderLockWhen(Cond cond) {
  FL_REAL("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking<void, Cond>(kRead, real, this, cond);
}
bool Mutex::ReaderLockWhenWithTimeout(Cond cond, Duration timeout) {
  FL_REAL("5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking<bool, Cond, Duration>(kRead, real, this, cond, timeout);
}
bool Mutex::ReaderLockWhenWithDeadline(Cond cond, Time deadline) {
  FL_REAL("5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking<bool, Cond, Time>(kRead, real, this, cond, deadline);
}

void Mutex::Await(Cond cond) {
  FL_REAL("5Mutex5AwaitERKNS0_9ConditionE");
  Waiting<void, Mutex, Cond>(real, this, this, cond);
}
bool Mutex::AwaitWithTimeout(Cond cond, Duration timeout) {
  FL_REAL("5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Waiting<bool, Mutex, Cond, Duration>(real, this, this, cond, timeout);
}
bool Mutex::AwaitWithDeadline(Cond cond, Time deadline) {
  FL_REAL("5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Waiting<bool, Mutex, Cond, Time>(real, this, this, cond, deadline);
}

void CondVar::Wait(Mutex* mu) {
  FL_REAL("7CondVar4WaitEPNS0_5MutexE");
  Waiting<void, CondVar, Mutex*>(real, mu, this, mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  FL_REAL("7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Waiting<bool, CondVar, Mutex*, Duration>(real, mu, this, mu, timeout);
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  FL_REAL("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Waiting<bool, CondVar, Mutex*, Time>(real, mu, this, mu, deadline);
}

// absl::Notification: Notify stores its flag (a release) inside the library, which TSan
// does not see, and a wait that finds the flag set returns without taking the Mutex,
// so what the notifier wrote before Notify looked unordered against what the waiter
// read after it returned. Notify now releases on the flag's address first, and a wait
// that returns notified acquires it; HasBeenNotified, inline in instrumented code,
// loads the flag with acquire itself, which TSan pairs with that release.
namespace {
// The flag follows the Mutex (notification.h: mutex_, then notified_yet_).
static_assert(sizeof(absl::Notification) == 2 * sizeof(absl::Mutex));
const void* FlagOf(const absl::Notification* n) {
  return reinterpret_cast<const char*>(n) + sizeof(absl::Mutex);
}
}  // namespace

void Notification::Notify() {
  FL_REAL("12Notification6NotifyEv");
  __tsan_release(const_cast<void*>(FlagOf(this)));
  Call<void>(real, this);
}
void Notification::WaitForNotification() const {
  FL_REAL_CONST("12Notification19WaitForNotificationEv");
  Call<void>(real, this);
  __tsan_acquire(const_cast<void*>(FlagOf(this)));
}
bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  FL_REAL_CONST("12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = Call<bool, const Notification, Duration>(real, this, timeout);
  if (notified) __tsan_acquire(const_cast<void*>(FlagOf(this)));
  return notified;
}
bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  FL_REAL_CONST("12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = Call<bool, const Notification, Time>(real, this, deadline);
  if (notified) __tsan_acquire(const_cast<void*>(FlagOf(this)));
  return notified;
}

}  // namespace absl
