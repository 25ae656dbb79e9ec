// Builds sysfs trees in a temporary directory, laid out as the kernel lays them out:
// devices/pciDDDD:BB/<root port>/<switch ports...>/<function>/ with vendor, class and
// numa_node files; bus/pci/devices/<bdf> and class/{infiniband,net}/<name> as
// relative symlinks into devices/. Removed with the fixture.
#pragma once

#include <string>
#include <vector>

namespace fuselink::topo::testing {

struct RdmaPortSpec {
  int port = 1;
  std::string state = "4: ACTIVE";
  std::string phys_state = "5: LinkUp";
  std::string link_layer = "InfiniBand";
  std::string rate = "400 Gb/sec (4X NDR)";
  std::string gid_netdev;  // written to ports/<p>/gid_attrs/ndevs/0 when non-empty
};

class SysfsFixture {
 public:
  SysfsFixture();
  ~SysfsFixture();
  SysfsFixture(const SysfsFixture&) = delete;
  SysfsFixture& operator=(const SysfsFixture&) = delete;

  const std::string& root() const { return root_; }

  // A PCI function under host bridge `root` ("pci0000:17") behind `bridges` (root
  // port first); each bridge gets its own directory with class 0x060400. Returns the
  // function's directory, relative to the root.
  std::string AddPci(const std::string& root, const std::vector<std::string>& bridges,
                     const std::string& function, int numa_node, unsigned vendor,
                     unsigned klass);
  std::string AddGpu(const std::string& root, const std::vector<std::string>& bridges,
                     const std::string& function, int numa_node) {
    return AddPci(root, bridges, function, numa_node, 0x10de, 0x030200);
  }
  // A netdev under the PCI function at `device_dir` (AddPci's result), with
  // class/net/<name> pointing at it.
  void AddNetdev(const std::string& device_dir, const std::string& name, bool up = true,
                 int dev_port = 0, int speed_mbit = -1, int type = 1);
  // An RDMA device on the function at `device_dir` with `ports`.
  void AddRdma(const std::string& device_dir, const std::string& name,
               const std::vector<RdmaPortSpec>& ports);
  // A Mellanox NIC in one go: the function, its netdev and the RDMA device.
  void AddMlxNic(const std::string& root, const std::vector<std::string>& bridges,
                 const std::string& function, int numa_node, const std::string& rdma,
                 const std::string& netdev, RdmaPortSpec port = {});

  void Write(const std::string& path, const std::string& text);
  void Symlink(const std::string& target, const std::string& link);  // both relative
  void Remove(const std::string& path);

 private:
  std::string root_;
};

}  // namespace fuselink::topo::testing
