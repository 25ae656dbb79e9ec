// Reading a sysfs tree that may live anywhere: the real /sys, or a fixture directory a
// test builds. Paths given to Sysfs are relative to its root ("class/net"); results
// that are paths (Resolve) are relative to the root too, so a fixture's symlinks may
// point inside the fixture exactly as the kernel's point inside /sys.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fuselink::topo {

// A PCI function's place in the PCIe tree, from the resolved path of its sysfs device
// directory, e.g. devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:02.0/0000:1b:00.0:
// root "pci0000:17", bridges {0000:17:01.0, 0000:18:00.0, 0000:19:02.0} (root port
// first), function "0000:1b:00.0".
struct PciPosition {
  std::string root;                  // "pciDDDD:BB", the host bridge
  std::vector<std::string> bridges;  // upstream bridges and switch ports, root port first
  std::string function;              // the device's own address, lower case
  int numa_node = -1;                // of the function (sysfs numa_node); -1 unknown
};

// True for "dddd:bb:dd.f" in hex (the kernel's form).
bool LooksLikeBdf(absl::string_view s);

// Parses a resolved device path (relative to the sysfs root). The function is the last
// component that looks like a BDF, so a path through a virtio or USB child
// (".../0000:00:03.0/virtio2") lands on the PCI function above it. NOT_FOUND when the
// path holds no "pci..." root or no BDF (a virtual device).
absl::StatusOr<PciPosition> ParsePciPath(absl::string_view resolved);

// Bound on one attribute file: sysfs attributes are a page or less; anything longer is
// not an attribute (a fixture's mistake, a file under a wrong path) and is refused
// rather than read whole.
inline constexpr size_t kMaxAttributeBytes = 64 * 1024;

class Sysfs {
 public:
  explicit Sysfs(std::string root) : root_(std::move(root)) {}
  const std::string& root() const { return root_; }

  // The file's contents, trailing whitespace removed. NOT_FOUND when absent,
  // FAILED_PRECONDITION when unreadable (the kernel answers EINVAL for some
  // attributes, e.g. an empty gid_attrs/ndevs entry; a directory) or longer than
  // kMaxAttributeBytes.
  absl::StatusOr<std::string> Read(absl::string_view path) const;
  // Read, parsed as a decimal or 0x-prefixed integer; INVALID_ARGUMENT otherwise.
  absl::StatusOr<long long> ReadInt(absl::string_view path) const;
  bool Exists(absl::string_view path) const;
  // Names in a directory, sorted; empty when it is absent.
  std::vector<std::string> List(absl::string_view path) const;
  // The path with every symlink resolved, relative to the root. NOT_FOUND when it does
  // not exist, FAILED_PRECONDITION when it leads outside the root.
  absl::StatusOr<std::string> Resolve(absl::string_view path) const;
  // ParsePciPath of Resolve(path), with the function's numa_node read.
  absl::StatusOr<PciPosition> Position(absl::string_view path) const;

 private:
  std::string Full(absl::string_view path) const;
  std::string root_;
};

}  // namespace fuselink::topo
