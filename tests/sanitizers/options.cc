// The sanitizers' default options, linked into every executable of a sanitized build
// (cmake/sanitize.cmake): a test binary, the agents the integration tests start and a
// binary run by hand behave alike. Each runtime calls its function once at start-up;
// *SAN_OPTIONS in the environment are parsed afterwards and win.
//
// Every report ends the process with a non-zero status (halt_on_error): ctest fails
// the test, and the integration harness fails a test whose agent logged a report.

#ifndef FUSELINK_SANITIZER_DIR
#error "FUSELINK_SANITIZER_DIR must name tests/sanitizers"
#endif

extern "C" {

// Leaks are checked at exit (an agent stopped with SIGTERM exits; one killed with
// SIGKILL does not, and is not checked). Globals are initialised in an order that
// does not depend on the link order.
const char* __asan_default_options() {
  return "detect_leaks=1:check_initialization_order=1:strict_init_order=1:"
         "halt_on_error=1";
}

const char* __lsan_default_options() {
  return "suppressions=" FUSELINK_SANITIZER_DIR "/lsan_suppressions.txt";
}

// -fno-sanitize-recover=undefined already aborts; the stack says where.
const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }

// Suppressions: races inside the uninstrumented gRPC, protobuf and abseil only; see
// the file. intercept_send=0: TSan does not count send()'s and sendmsg()'s reads of
// the buffer as accesses. What orders them before the buffer is reused is the
// network: a TCP fabric write completes when the peer's ACK for it arrives, which it
// sends once every byte was received, and gRPC frees a sent slice once its transport
// says so; TSan sees neither edge, and reported every reuse of a sent buffer as a
// race with the send (tcp_fabric_test: the test freeing a written vector after its
// completion; every gRPC call: a freed request slice).
const char* __tsan_default_options() {
  return "halt_on_error=1:second_deadlock_stack=1:intercept_send=0:"
         "suppressions=" FUSELINK_SANITIZER_DIR "/tsan_suppressions.txt";
}

}  // extern "C"
