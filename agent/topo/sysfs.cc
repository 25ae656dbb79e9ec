#include "agent/topo/sysfs.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fuselink::topo {
namespace {

bool AllHex(absl::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isxdigit(c); });
}

}  // namespace

bool LooksLikeBdf(absl::string_view s) {
  // dddd:bb:dd.f
  if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return false;
  return AllHex(s.substr(0, 4)) && AllHex(s.substr(5, 2)) && AllHex(s.substr(8, 2)) &&
         AllHex(s.substr(11, 1));
}

absl::StatusOr<PciPosition> ParsePciPath(absl::string_view resolved) {
  PciPosition position;
  std::vector<std::string> chain;
  for (absl::string_view part : absl::StrSplit(resolved, '/', absl::SkipEmpty())) {
    if (position.root.empty()) {
      // "pciDDDD:BB": the host bridge. Everything above it (devices/) is not PCI.
      if (absl::StartsWith(part, "pci") && part.size() == 10 && part[7] == ':' &&
          AllHex(part.substr(3, 4)) && AllHex(part.substr(8, 2))) {
        position.root = absl::AsciiStrToLower(part);
      }
      continue;
    }
    if (LooksLikeBdf(part)) chain.push_back(absl::AsciiStrToLower(part));
  }
  if (position.root.empty() || chain.empty()) {
    return absl::NotFoundError(absl::StrCat("'", resolved, "' is not a PCI device path"));
  }
  position.function = chain.back();
  chain.pop_back();
  position.bridges = std::move(chain);
  return position;
}

std::string Sysfs::Full(absl::string_view path) const {
  return absl::StrCat(root_, "/", path);
}

absl::StatusOr<std::string> Sysfs::Read(absl::string_view path) const {
  const std::string full = Full(path);
  const int fd = open(full.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;  // read at once: nothing in between may change it
    if (error == ENOENT || error == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(full, ": absent"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(full, ": cannot open: ", std::strerror(error)));
  }
  absl::Cleanup close_fd = [fd] { close(fd); };
  std::string text;
  char chunk[4096];  // a page: what the kernel returns for an attribute
  for (;;) {
    const ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(full, ": cannot read: ", std::strerror(errno)));
    }
    if (n == 0) break;
    text.append(chunk, static_cast<size_t>(n));
    if (text.size() > kMaxAttributeBytes) {
      return absl::FailedPreconditionError(absl::StrCat(
          full, ": longer than ", kMaxAttributeBytes, " bytes, not a sysfs attribute"));
    }
  }
  absl::StripTrailingAsciiWhitespace(&text);
  return text;
}

absl::StatusOr<long long> Sysfs::ReadInt(absl::string_view path) const {
  absl::StatusOr<std::string> text = Read(path);
  if (!text.ok()) return text.status();
  long long value = 0;
  absl::string_view digits = *text;
  bool ok = false;
  if (absl::ConsumePrefix(&digits, "0x")) {
    unsigned long long u = 0;
    ok = absl::SimpleHexAtoi(digits, &u);
    value = static_cast<long long>(u);
  } else {
    ok = absl::SimpleAtoi(digits, &value);
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(Full(path), ": '", *text, "' is not a number"));
  }
  return value;
}

bool Sysfs::Exists(absl::string_view path) const {
  struct stat st;
  return stat(Full(path).c_str(), &st) == 0;
}

std::vector<std::string> Sysfs::List(absl::string_view path) const {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(Full(path), ec), end; !ec && it != end;
       it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::string> Sysfs::Resolve(absl::string_view path) const {
  char root_buf[PATH_MAX], buf[PATH_MAX];
  if (realpath(root_.c_str(), root_buf) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("sysfs root ", root_, ": ", std::strerror(errno)));
  }
  const std::string full = Full(path);
  if (realpath(full.c_str(), buf) == nullptr) {
    return absl::NotFoundError(absl::StrCat(full, ": ", std::strerror(errno)));
  }
  absl::string_view resolved = buf;
  const absl::string_view root = root_buf;
  if (root == "/") {
    absl::ConsumePrefix(&resolved, "/");
    return std::string(resolved);
  }
  if (!absl::ConsumePrefix(&resolved, root) ||
      (!resolved.empty() && !absl::ConsumePrefix(&resolved, "/"))) {
    return absl::FailedPreconditionError(
        absl::StrCat(full, " resolves to ", buf, ", outside ", root_buf));
  }
  return std::string(resolved);
}

absl::StatusOr<PciPosition> Sysfs::Position(absl::string_view path) const {
  absl::StatusOr<std::string> resolved = Resolve(path);
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<PciPosition> position = ParsePciPath(*resolved);
  if (!position.ok()) return position.status();
  // -1 where the kernel has no NUMA information (or the file is absent or malformed).
  absl::StatusOr<long long> numa =
      ReadInt(absl::StrCat("bus/pci/devices/", position->function, "/numa_node"));
  if (!numa.ok()) numa = ReadInt(absl::StrCat(*resolved, "/numa_node"));
  position->numa_node =
      numa.ok() && *numa >= 0 && *numa < 1024 ? static_cast<int>(*numa) : -1;
  return position;
}

}  // namespace fuselink::topo
