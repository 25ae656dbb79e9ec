// A real fuselink-agent process for integration tests: started with fork/exec in its
// own process group, its files (log, ready file, handle socket) in a per-test
// directory, every port chosen by the kernel, and its NICs on a loopback net of its
// own so that agents started by one test binary never share NIC addresses.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "fuselink/v1/agent.grpc.pb.h"

namespace fuselink::testing {

// Long enough for a loaded 2-core machine; every wait ends as soon as its condition
// holds, so this bounds only a failing test.
inline constexpr absl::Duration kWaitTimeout = absl::Seconds(20);

// The first sanitizer report in an agent's log (AddressSanitizer, LeakSanitizer,
// UndefinedBehaviorSanitizer, ThreadSanitizer), at most kReportLines lines of it, or
// empty when there is none.
inline constexpr int kReportLines = 60;
std::string FindSanitizerReport(absl::string_view log);

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it when the
// object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class AgentProcess {
 public:
  // Starts `fuselink-agent --node=<node>` with --listen=127.0.0.1:0 (unless `flags`
  // give --listen), a handle socket, ready file and log in `dir`, an emulated node
  // (--topology=emulated) on a loopback net of its own, and `flags`. Returns once the
  // agent has written its ready file; UNAVAILABLE with the agent's log when it exits or
  // is not ready within kWaitTimeout.
  static absl::StatusOr<std::unique_ptr<AgentProcess>> Start(
      const std::string& dir, const std::string& node,
      const std::vector<std::string>& flags = {});
  // Kills (SIGKILL) and reaps the process if it still runs.
  ~AgentProcess();
  // Once the process is reaped, however it ended, its log is searched for a sanitizer
  // report: one found fails the running test (ADD_FAILURE), quoting it. In a
  // sanitized build an agent's report thus fails the test that started it, even when
  // the test then kills the agent.
  AgentProcess(const AgentProcess&) = delete;
  AgentProcess& operator=(const AgentProcess&) = delete;

  const std::string& node() const { return node_; }
  // "127.0.0.1:port" of the gRPC server.
  const std::string& grpc_address() const { return grpc_address_; }
  // "http://127.0.0.1:port/metrics".
  const std::string& metrics_url() const { return metrics_url_; }
  const std::string& handle_socket() const { return handle_socket_; }
  const std::string& log_path() const { return log_path_; }
  pid_t pid() const { return pid_; }
  // A stub on a channel of its own to this agent, as the harness's client
  // (pki.h: router, engine and viewer at once).
  v1::Agent::Stub& stub() { return *stub_; }
  // A stub presenting <kind>-<name>'s certificate (pki.h), or none (kind empty).
  std::unique_ptr<v1::Agent::Stub> StubAs(const std::string& kind,
                                          const std::string& name) const;

  // SIGKILL to the process group, then reaps. Idempotent.
  void Kill();
  // SIGSTOP and SIGCONT: a paused agent neither reads nor answers, so a transfer
  // it takes part in stands still, for as long as a test needs it running.
  void Pause();
  void Resume();
  // Sends SIGTERM and returns; Stop() then waits for the exit.
  void Terminate();
  // SIGTERM, then waits up to `timeout` for a clean exit (SIGKILL after it). OK when
  // the agent exited with status 0.
  absl::Status Stop(absl::Duration timeout = kWaitTimeout);
  // True until the process has been reaped or has exited.
  bool Running();
  // The agent's stdout and stderr so far.
  std::string Log() const;

 private:
  AgentProcess() = default;
  // Waits up to `timeout` for the process to exit and reaps it; true if it did.
  bool Reap(absl::Duration timeout);
  // Fails the running test if the log holds a sanitizer report.
  void CheckLogForReports() const;

  std::string node_;
  std::string grpc_address_;
  std::string metrics_url_;
  std::string handle_socket_;
  std::string log_path_;
  bool plaintext_ = false;  // started with --plaintext
  pid_t pid_ = -1;
  int exit_status_ = 0;  // as waitpid gives it, once reaped
  std::unique_ptr<v1::Agent::Stub> stub_;
};

}  // namespace fuselink::testing
