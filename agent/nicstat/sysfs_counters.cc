#include "agent/nicstat/sysfs_counters.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::nicstat {

CounterSource::CounterSource(std::string tx_path, std::string rx_path,
                             uint64_t unit_bytes, std::string description)
    : tx_{std::move(tx_path), UniqueFd()},
      rx_{std::move(rx_path), UniqueFd()},
      unit_bytes_(unit_bytes),
      description_(std::move(description)) {}

// A counter file's value: one decimal number and a newline, far under 64 bytes.
absl::StatusOr<uint64_t> CounterSource::ReadFile(File& file) {
  char text[64];
  ssize_t n = -1;
  int error = 0;
  for (int attempt = 0; attempt < 2 && n < 0; ++attempt) {
    if (!file.fd.valid() || attempt > 0) {
      file.fd.reset(::open(file.path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!file.fd.valid()) {
        error = errno;
        continue;
      }
    }
    n = ::pread(file.fd.get(), text, sizeof text - 1, 0);  // sysfs: a fresh value
    if (n < 0) error = errno;
  }
  if (n < 0) {
    return WithReason(absl::UnavailableError(
                          absl::StrCat("read ", file.path, ": ", std::strerror(error))),
                      reasons::kCounterRead);
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(text, n)), &value)) {
    return WithReason(
        absl::UnavailableError(absl::StrCat(file.path, " does not hold a counter")),
        reasons::kCounterRead);
  }
  return value;
}

absl::StatusOr<CounterSource> CounterSource::Netdev(absl::string_view sysfs_root,
                                                    absl::string_view netdev) {
  const std::string dir = absl::StrCat(sysfs_root, "/class/net/", netdev, "/statistics/");
  CounterSource source(dir + "tx_bytes", dir + "rx_bytes", 1,
                       absl::StrCat("netdev ", netdev));
  if (absl::StatusOr<KernelBytes> now = source.Read(); !now.ok()) {
    return WithReason(
        absl::NotFoundError(absl::StrCat(
            "netdev ", netdev, " has no byte counters: ", now.status().message())),
        reasons::kNoCounters);
  }
  return source;
}

namespace {

namespace fs = std::filesystem;

// Calls `each` with every entry of `dir` until it returns true; true if one did.
// Errors (a missing directory, one that vanishes while read) end the walk: agent/
// takes no exceptions, so every step goes through an error_code.
template <typename Fn>
bool AnyEntry(const fs::path& dir, Fn each) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (each(*it)) return true;
  }
  return false;
}

// Whether the file at `path` holds `name` and a newline.
bool Names(const fs::path& path, absl::string_view name) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  char text[64];
  const ssize_t n = ::read(fd.get(), text, sizeof text - 1);
  return n > 0 && absl::StripAsciiWhitespace(absl::string_view(text, n)) == name;
}

}  // namespace

absl::StatusOr<CounterSource> CounterSource::RdmaPortOf(absl::string_view sysfs_root,
                                                        absl::string_view netdev) {
  const fs::path ib = fs::path(std::string(sysfs_root)) / "class" / "infiniband";
  std::optional<absl::StatusOr<CounterSource>> found;
  AnyEntry(ib, [&](const fs::directory_entry& device) {
    return AnyEntry(device.path() / "ports", [&](const fs::directory_entry& port) {
      const bool ours = AnyEntry(
          port.path() / "gid_attrs" / "ndevs",
          [&](const fs::directory_entry& ndev) { return Names(ndev.path(), netdev); });
      if (!ours) return false;
      const std::string dir = (port.path() / "counters").string() + "/";
      // port_xmit_data and port_rcv_data count 32-bit words (IBA PortCounters).
      CounterSource source(dir + "port_xmit_data", dir + "port_rcv_data", 4,
                           absl::StrCat("RDMA ", device.path().filename().string(),
                                        " port ", port.path().filename().string()));
      if (absl::StatusOr<KernelBytes> now = source.Read(); !now.ok()) {
        found = WithReason(
            absl::NotFoundError(absl::StrCat(
                source.description(), " has no data counters: ", now.status().message())),
            reasons::kNoCounters);
      } else {
        found = std::move(source);
      }
      return true;
    });
  });
  if (found.has_value()) return *std::move(found);
  return WithReason(absl::NotFoundError(absl::StrCat("no RDMA port under ", ib.string(),
                                                     " belongs to netdev ", netdev)),
                    reasons::kNoRdmaPort);
}

absl::StatusOr<KernelBytes> CounterSource::Read() {
  FL_ASSIGN_OR_RETURN(uint64_t tx, ReadFile(tx_));
  FL_ASSIGN_OR_RETURN(uint64_t rx, ReadFile(rx_));
  return KernelBytes{tx * unit_bytes_, rx * unit_bytes_};
}

}  // namespace fuselink::nicstat
