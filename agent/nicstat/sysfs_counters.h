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
  // cannot be read or parsed.
  absl::StatusOr<KernelBytes> Read() const;
  // Where the counters come from, e.g. "netdev eth0" or "RDMA mlx5_0 port 1".
  const std::string& description() const { return description_; }

 private:
  CounterSource(std::string tx_path, std::string rx_path, uint64_t unit_bytes,
                std::string description);
  std::string tx_path_, rx_path_;
  uint64_t unit_bytes_;
  std::string description_;
};

}  // namespace fuselink::nicstat
