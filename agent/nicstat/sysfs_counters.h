// A NIC's cumulative transmitted and received bytes as the kernel counts them, read
// from sysfs under an injectable root (tests build their own tree):
//  - a TCP rail: its netdev's <root>/class/net/<if>/statistics/{tx,rx}_bytes, every
//    frame the interface moved, headers included;
//  - an RDMA port: <root>/class/infiniband/<dev>/ports/<port>/counters/
//    port_{xmit,rcv}_data, in units of 4 bytes (the InfiniBand PortCounters'
//    octets divided by four), all the port's traffic.
// The RDMA port of a netdev is the one whose gid_attrs/ndevs name it (RoCE; rxe too).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/common/unique_fd.h"

namespace fuselink::nicstat {

struct KernelBytes {
  uint64_t tx = 0;
  uint64_t rx = 0;
};

class CounterSource {
 public:
  // The netdev `netdev`'s counters. NOT_FOUND (NO_COUNTERS) when its statistics
  // files are missing or unreadable.
  static absl::StatusOr<CounterSource> Netdev(absl::string_view sysfs_root,
                                              absl::string_view netdev);
  // The counters of the RDMA port whose GIDs belong to `netdev`. NOT_FOUND
  // (NO_RDMA_PORT) when no port names it, (NO_COUNTERS) when its counters are
  // missing.
  static absl::StatusOr<CounterSource> RdmaPortOf(absl::string_view sysfs_root,
                                                  absl::string_view netdev);

  // Both counters now, in bytes. UNAVAILABLE (COUNTER_READ) naming the file when one
  // cannot be read or parsed. The files stay open between reads (a read from offset
  // 0 is a fresh value: two syscalls a look, not six); one that fails is opened
  // again by its path once (a re-created netdev). One caller at a time.
  absl::StatusOr<KernelBytes> Read();
  // Where the counters come from, e.g. "netdev eth0" or "RDMA mlx5_0 port 1".
  const std::string& description() const { return description_; }
  // The same for two sources exactly when they read the same counters.
  const std::string& id() const { return tx_.path; }

 private:
  CounterSource(std::string tx_path, std::string rx_path, uint64_t unit_bytes,
                std::string description);
  // One counter file and its descriptor (opened on first use).
  struct File {
    std::string path;
    UniqueFd fd;
  };
  static absl::StatusOr<uint64_t> ReadFile(File& file);
  File tx_, rx_;
  uint64_t unit_bytes_;
  std::string description_;
};

}  // namespace fuselink::nicstat
