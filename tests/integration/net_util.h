// Plain sockets for the tests that talk to an agent the way no client library would:
// a raw TCP connection to a NIC port; and packets dropped, as on a rail gone down.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/common/unique_fd.h"

namespace fuselink::testing {

// A TCP connection to `host`:`port`.
absl::StatusOr<UniqueFd> TcpConnect(const std::string& host, uint16_t port);

// True when the peer closes `fd` (EOF or reset) within `timeout`; bytes it sends
// first are read and dropped.
bool WaitUntilClosed(int fd, absl::Duration timeout);

// A port on 127.0.0.1 that nothing listens on while the returned socket stays open:
// it is bound, never listened on, so connecting is refused.
absl::StatusOr<UniqueFd> ReserveClosedPort(uint16_t* port);

// An address ("127.0.0.1:<port>", the address the test certificates name) for an
// agent to listen on that must be known before the agent starts (another agent names
// it in --peer), with nothing bound there. Not a port the kernel picked and let go
// of, which any socket of any process may be handed next: a port below the kernel's
// ephemeral range (ip_local_port_range), where no socket bound to port 0 ever lands,
// found free by binding it; which ports are tried first depends on the pid and a
// counter, so that test binaries side by side try different ones.
absl::StatusOr<std::string> FreeListenAddress();

// IPv4 packets from and to some addresses dropped, as on a rail that went down: an
// nftables table of this process ("fuselink_test_<pid>_<n>") with a chain in the input
// hook. Loopback packets pass it on their way in, so both directions are cut there and
// senders see no error, as on a dead link. Needs root and nft(8) (scripts/setup.sh
// installs nftables). The table goes with the object; a test binary that crashes leaves
// it (`nft list tables`, `nft delete table ip <name>`). Not thread-safe.
class PacketDrop {
 public:
  // FAILED_PRECONDITION, with nft's words, when the table cannot be made.
  static absl::StatusOr<std::unique_ptr<PacketDrop>> Create();
  ~PacketDrop();
  PacketDrop(const PacketDrop&) = delete;
  PacketDrop& operator=(const PacketDrop&) = delete;

  // Drops every packet from or to `addresses` (IPv4 literals) until Restore; each
  // returns once the kernel has the rules. INTERNAL with nft's words if nft fails.
  absl::Status Drop(const std::vector<std::string>& addresses);
  absl::Status Restore();

 private:
  explicit PacketDrop(std::string table) : table_(std::move(table)) {}
  std::string table_;
};

}  // namespace fuselink::testing
