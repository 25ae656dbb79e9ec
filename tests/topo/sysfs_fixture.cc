#include "tests/topo/sysfs_fixture.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fuselink::topo::testing {
namespace fs = std::filesystem;

SysfsFixture::SysfsFixture() {
  std::string tmpl = (fs::temp_directory_path() / "fuselink-sysfs.XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  root_ = tmpl;
}

SysfsFixture::~SysfsFixture() {
  std::error_code ec;
  fs::remove_all(root_, ec);
}

void SysfsFixture::Write(const std::string& path, const std::string& text) {
  const fs::path full = fs::path(root_) / path;
  fs::create_directories(full.parent_path());
  std::ofstream(full) << text << "\n";
}

void SysfsFixture::Symlink(const std::string& target, const std::string& link) {
  const fs::path full_link = fs::path(root_) / link;
  fs::create_directories(full_link.parent_path());
  std::error_code ec;
  fs::remove(full_link, ec);
  fs::create_directory_symlink(
      fs::relative(fs::path(root_) / target, full_link.parent_path()), full_link);
}

void SysfsFixture::Remove(const std::string& path) {
  std::error_code ec;
  fs::remove_all(fs::path(root_) / path, ec);
}

std::string SysfsFixture::AddPci(const std::string& root,
                                 const std::vector<std::string>& bridges,
                                 const std::string& function, int numa_node,
                                 unsigned vendor, unsigned klass) {
  std::string dir = absl::StrCat("devices/", root);
  for (const std::string& b : bridges) {
    dir = absl::StrCat(dir, "/", b);
    if (!fs::exists(fs::path(root_) / dir / "class")) {
      Write(dir + "/vendor", "0x8086");
      Write(dir + "/class", "0x060400");
      Write(dir + "/numa_node", absl::StrCat(numa_node));
      Symlink(dir, absl::StrCat("bus/pci/devices/", b));
    }
  }
  dir = absl::StrCat(dir, "/", function);
  Write(dir + "/vendor", absl::StrFormat("0x%04x", vendor));
  Write(dir + "/class", absl::StrFormat("0x%06x", klass));
  Write(dir + "/numa_node", absl::StrCat(numa_node));
  Symlink(dir, absl::StrCat("bus/pci/devices/", function));
  return dir;
}

void SysfsFixture::AddNetdev(const std::string& device_dir, const std::string& name,
                             bool up, int dev_port, int speed_mbit, int type) {
  const std::string dir = absl::StrCat(device_dir, "/net/", name);
  Write(dir + "/flags", up ? "0x1003" : "0x1002");
  Write(dir + "/operstate", up ? "up" : "down");
  Write(dir + "/dev_port", absl::StrCat(dev_port));
  Write(dir + "/speed", absl::StrCat(speed_mbit));
  Write(dir + "/type", absl::StrCat(type));
  Symlink(device_dir, dir + "/device");
  Symlink(dir, absl::StrCat("class/net/", name));
}

void SysfsFixture::AddRdma(const std::string& device_dir, const std::string& name,
                           const std::vector<RdmaPortSpec>& ports) {
  const std::string dir = absl::StrCat(device_dir, "/infiniband/", name);
  Symlink(device_dir, dir + "/device");
  for (const RdmaPortSpec& p : ports) {
    const std::string pdir = absl::StrCat(dir, "/ports/", p.port);
    Write(pdir + "/state", p.state);
    Write(pdir + "/phys_state", p.phys_state);
    Write(pdir + "/link_layer", p.link_layer);
    Write(pdir + "/rate", p.rate);
    if (!p.gid_netdev.empty()) Write(pdir + "/gid_attrs/ndevs/0", p.gid_netdev);
  }
  Symlink(dir, absl::StrCat("class/infiniband/", name));
}

void SysfsFixture::AddMlxNic(const std::string& root,
                             const std::vector<std::string>& bridges,
                             const std::string& function, int numa_node,
                             const std::string& rdma, const std::string& netdev,
                             RdmaPortSpec port) {
  const std::string dir = AddPci(root, bridges, function, numa_node, 0x15b3, 0x020700);
  if (!netdev.empty()) {
    AddNetdev(dir, netdev, true, 0, -1, port.link_layer == "InfiniBand" ? 32 : 1);
  }
  AddRdma(dir, rdma, {port});
}

}  // namespace fuselink::topo::testing
