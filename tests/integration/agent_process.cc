#include "tests/integration/agent_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "clients/cpp/client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/pki.h"

#ifndef FUSELINK_AGENT_PATH
#error "FUSELINK_AGENT_PATH must name the fuselink-agent binary"
#endif

namespace fuselink::testing {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(5);

// 127.0.<net>.x for the next agent: a counter seeded by the pid, so that agents of
// one binary never share a net and binaries run side by side rarely do. Nets 0 and 1
// are left to the agent's default and to anything else on the machine.
int NextLoopbackNet() {
  static std::atomic<int> next{static_cast<int>(getpid() % 250)};
  return 2 + next.fetch_add(1) % 250;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

std::string FindSanitizerReport(absl::string_view log) {
  static constexpr absl::string_view kMarkers[] = {
      "ERROR: AddressSanitizer",  "ERROR: LeakSanitizer",
      "WARNING: ThreadSanitizer", "ERROR: ThreadSanitizer",
      ": runtime error: ",        "ERROR: UndefinedBehaviorSanitizer",
  };
  size_t first = absl::string_view::npos;
  for (absl::string_view marker : kMarkers) first = std::min(first, log.find(marker));
  if (first == absl::string_view::npos) return "";
  // From the start of that line, kReportLines lines.
  const size_t line = log.rfind('\n', first);
  size_t begin = line == absl::string_view::npos ? 0 : line + 1, end = begin;
  for (int i = 0; i < kReportLines && end != absl::string_view::npos; ++i) {
    end = log.find('\n', end + 1);
  }
  return std::string(
      log.substr(begin, end == absl::string_view::npos ? end : end + 1 - begin));
}

TempDir::TempDir() {
  const char* base = getenv("TMPDIR");
  std::string pattern = absl::StrCat(base != nullptr && *base != '\0' ? base : "/tmp",
                                     "/fuselink-it-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

absl::StatusOr<std::unique_ptr<AgentProcess>> AgentProcess::Start(
    const std::string& dir, const std::string& node,
    const std::vector<std::string>& flags) {
  static std::atomic<int> instances{0};
  const std::string stem = absl::StrCat(dir, "/", node, ".", instances.fetch_add(1));
  std::unique_ptr<AgentProcess> agent(new AgentProcess());
  agent->node_ = node;
  agent->log_path_ = stem + ".log";
  const std::string ready_path = stem + ".ready";

  std::vector<std::string> args = {
      FUSELINK_AGENT_PATH, absl::StrCat("--node=", node),
      absl::StrCat("--handle_socket=", dir, "/", node, ".sock"),
      absl::StrCat("--ready_file=", ready_path),
      // An emulated node unless the test gives --topology itself (a later flag wins).
      "--topology=emulated", absl::StrCat("--loopback_net=", NextLoopbackNet()),
      "--gpu=off",  // host memory only, on every machine
  };
  bool has_listen = false, plaintext = false, own_tls = false;
  for (const std::string& flag : flags) {
    has_listen |= absl::StartsWith(flag, "--listen=");
    plaintext |= flag == "--plaintext";
    own_tls |= absl::StartsWith(flag, "--tls_cert=");
  }
  if (!has_listen) args.push_back("--listen=127.0.0.1:0");
  // Mutual TLS, as agents run by default, unless the test brings its own.
  if (!plaintext && !own_tls) {
    for (std::string& flag : AgentTlsFlags(node)) args.push_back(std::move(flag));
  }
  agent->plaintext_ = plaintext;
  args.insert(args.end(), flags.begin(), flags.end());
  // Everything the child touches is made before fork: after it, in a process with
  // threads, the child may only make async-signal-safe calls.
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int log_fd =
      open(agent->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (log_fd < 0 || null_fd < 0) {
    return absl::InternalError(
        absl::StrCat("open log ", agent->log_path_, ": errno ", errno));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    // The agent dies with the test binary, even when the binary crashes.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
  close(null_fd);
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: errno ", errno));
  setpgid(pid, pid);  // also here, so that a kill right away reaches the group
  agent->pid_ = pid;

  const absl::Time give_up = absl::Now() + kWaitTimeout;
  std::string ready;
  while (true) {
    ready = ReadFile(ready_path);  // written whole: the agent renames it into place
    if (!ready.empty()) break;
    if (!agent->Running()) {
      return absl::UnavailableError(absl::StrCat("agent ", node, " exited (status ",
                                                 agent->exit_status_,
                                                 ") before it was "
                                                 "ready; its log:\n",
                                                 agent->Log()));
    }
    if (absl::Now() > give_up) {
      agent->Kill();
      return absl::UnavailableError(absl::StrCat("agent ", node, " not ready within ",
                                                 absl::FormatDuration(kWaitTimeout),
                                                 "; its log:\n", agent->Log()));
    }
    absl::SleepFor(kPollInterval);
  }
  agent->grpc_address_ = client::ReadyField(ready, "grpc");
  agent->metrics_url_ = client::ReadyField(ready, "metrics");
  agent->handle_socket_ = client::ReadyField(ready, "handle_socket");
  if (agent->grpc_address_.empty() || agent->metrics_url_.empty() ||
      agent->handle_socket_.empty()) {
    return absl::InternalError(absl::StrCat("bad ready file: ", ready));
  }
  agent->stub_ = v1::Agent::NewStub(
      plaintext
          ? grpc::CreateChannel(agent->grpc_address_, grpc::InsecureChannelCredentials())
          : ClientChannel(agent->grpc_address_));
  return agent;
}

AgentProcess::~AgentProcess() { Kill(); }

std::unique_ptr<v1::Agent::Stub> AgentProcess::StubAs(const std::string& kind,
                                                      const std::string& name) const {
  return v1::Agent::NewStub(ClientChannel(grpc_address_, kind, name));
}

void AgentProcess::Kill() {
  if (pid_ <= 0) return;
  if (kill(-pid_, SIGKILL) != 0) kill(pid_, SIGKILL);
  Reap(absl::InfiniteDuration());
}

void AgentProcess::Pause() {
  if (pid_ > 0) kill(pid_, SIGSTOP);
}

void AgentProcess::Resume() {
  if (pid_ > 0) kill(pid_, SIGCONT);
}

void AgentProcess::Terminate() {
  if (pid_ > 0) kill(pid_, SIGTERM);
}

absl::Status AgentProcess::Stop(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("the agent is not running");
  Terminate();  // a second SIGTERM is harmless: the agent stops at the first
  if (!Reap(timeout)) {
    Kill();
    return absl::DeadlineExceededError(absl::StrCat(
        "agent ", node_, " did not stop within ", absl::FormatDuration(timeout)));
  }
  if (!WIFEXITED(exit_status_) || WEXITSTATUS(exit_status_) != 0) {
    return absl::InternalError(
        absl::StrCat("agent ", node_, " ended with wait status ", exit_status_));
  }
  return absl::OkStatus();
}

bool AgentProcess::Running() { return pid_ > 0 && !Reap(absl::ZeroDuration()); }

bool AgentProcess::Reap(absl::Duration timeout) {
  if (pid_ <= 0) return true;
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t r =
        waitpid(pid_, &status, timeout == absl::InfiniteDuration() ? 0 : WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      exit_status_ = status;
      pid_ = -1;
      CheckLogForReports();
      return true;
    }
    if (r < 0 && errno == EINTR) continue;
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(kPollInterval);
  }
}

std::string AgentProcess::Log() const { return ReadFile(log_path_); }

void AgentProcess::CheckLogForReports() const {
  const std::string report = FindSanitizerReport(Log());
  if (!report.empty()) {
    ADD_FAILURE() << "agent " << node_ << " (" << log_path_
                  << ") logged a sanitizer report:\n"
                  << report;
  }
}

}  // namespace fuselink::testing
