#include "tests/integration/net_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"

namespace fuselink::testing {
namespace {

constexpr int kIoTimeoutMs = 10000;

absl::StatusOr<sockaddr_in> Address(const std::string& host, uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not an IPv4 address: ", host));
  }
  return addr;
}

// Runs `nft '<script>'`; its output when it fails.
absl::Status Nft(const std::string& script) {
  const std::string command = absl::StrCat("nft '", script, "' 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return ErrnoStatus("popen(nft)", errno);
  std::string output;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int status = pclose(pipe);
  if (status == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(command, ": exit status ", status, ": ", output));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PacketDrop>> PacketDrop::Create() {
  static std::atomic<int> tables{0};
  const std::string table =
      absl::StrCat("fuselink_test_", getpid(), "_", tables.fetch_add(1));
  const absl::Status made =
      Nft(absl::StrCat("add table ip ", table, "; add chain ip ", table,
                       " input { type filter hook input priority filter; }"));
  if (!made.ok()) return absl::FailedPreconditionError(made.message());
  return std::unique_ptr<PacketDrop>(new PacketDrop(table));
}

PacketDrop::~PacketDrop() { Nft(absl::StrCat("delete table ip ", table_)).IgnoreError(); }

absl::Status PacketDrop::Drop(const std::vector<std::string>& addresses) {
  const std::string set = absl::StrCat("{ ", absl::StrJoin(addresses, ", "), " }");
  return Nft(absl::StrCat("add rule ip ", table_, " input ip saddr ", set,
                          " drop; add rule ip ", table_, " input ip daddr ", set,
                          " drop"));
}

absl::Status PacketDrop::Restore() {
  return Nft(absl::StrCat("flush chain ip ", table_, " input"));
}

absl::StatusOr<UniqueFd> TcpConnect(const std::string& host, uint16_t port) {
  FL_ASSIGN_OR_RETURN(sockaddr_in addr, Address(host, port));
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  timeval tv{.tv_sec = kIoTimeoutMs / 1000, .tv_usec = 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(absl::StrCat("connect(", host, ":", port, ")"), errno);
  }
  return fd;
}

bool WaitUntilClosed(int fd, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  char buffer[4096];
  while (absl::Now() < give_up) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    const int ready = poll(&p, 1, 50);
    if (ready <= 0) continue;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
  return false;
}

absl::StatusOr<std::string> FreeListenAddress() {
  static std::atomic<uint32_t> next{static_cast<uint32_t>(getpid()) * 97};
  const uint32_t n = next.fetch_add(1);
  const std::string host = "127.0.0.1";
  int ephemeral_low = 32768;  // Linux's default
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &ephemeral_low) != 1) ephemeral_low = 32768;
    std::fclose(f);
  }
  const int first = std::max(1024, ephemeral_low - 8000);
  const int span = ephemeral_low - first;
  if (span <= 0)
    return absl::FailedPreconditionError("no ports below the ephemeral range");
  for (int i = 0; i < span; ++i) {
    const uint16_t port = static_cast<uint16_t>(first + (n * 131 + i) % span);
    FL_ASSIGN_OR_RETURN(sockaddr_in addr, Address(host, port));
    UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return ErrnoStatus("socket", errno);
    if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) {
      return absl::StrCat(host, ":", port);
    }
    if (errno != EADDRINUSE) return ErrnoStatus(absl::StrCat("bind(", host, ")"), errno);
  }
  return absl::ResourceExhaustedError(absl::StrCat("no free port on ", host));
}

absl::StatusOr<UniqueFd> ReserveClosedPort(uint16_t* port) {
  FL_ASSIGN_OR_RETURN(sockaddr_in addr, Address("127.0.0.1", 0));
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus("socket", errno);
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus("bind(127.0.0.1:0)", errno);
  }
  socklen_t len = sizeof(addr);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return ErrnoStatus("getsockname", errno);
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace fuselink::testing
