// Linked (as an object, so that its initializer runs) into every test binary: a test
// that crashes prints its thread's symbolized stack before it dies, so that a crash
// seen once in CI (where no debugger runs) says where it happened. Not under ASan or
// TSan: they report crashes themselves, better.
#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"

namespace fuselink::testing {
namespace {

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FUSELINK_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FUSELINK_SANITIZED 1
#endif

[[maybe_unused]] const bool kInstalled = [] {
#ifndef FUSELINK_SANITIZED
  absl::InitializeSymbolizer("/proc/self/exe");
  absl::InstallFailureSignalHandler({});
#endif
  return true;
}();

}  // namespace
}  // namespace fuselink::testing
