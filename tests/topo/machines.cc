#include "tests/topo/machines.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fuselink::topo::testing {

std::string Bdf(int bus, int dev, int fn) {
  return absl::StrFormat("0000:%02x:%02x.%x", bus, dev, fn);
}
std::string Root(int bus) { return absl::StrFormat("pci0000:%02x", bus); }

void BuildDgx(SysfsFixture& f) {
  for (int i = 0; i < 8; ++i) {
    const int b = kDgxBus[i];
    const std::vector<std::string> to_switch = {Bdf(b, 1), Bdf(b + 1)};
    auto below = [&](int port) {
      std::vector<std::string> v = to_switch;
      v.push_back(Bdf(b + 2, port));
      return v;
    };
    f.AddGpu(Root(b), below(0), Bdf(b + 3), i / 4);
    const std::string rdma = absl::StrCat("mlx5_", i < 4 ? i : i + 2);
    f.AddMlxNic(Root(b), below(1), Bdf(b + 4), i / 4, rdma, absl::StrCat("ib", i));
  }
  RdmaPortSpec eth;
  eth.link_layer = "Ethernet";
  eth.rate = "200 Gb/sec (4X HDR)";
  eth.gid_netdev = "enp81s0f0np0";
  f.AddMlxNic(Root(0x50), {Bdf(0x50, 1)}, Bdf(0x51, 0, 0), 0, "mlx5_4", "enp81s0f0np0",
              eth);
  eth.gid_netdev = "enp81s0f1np1";
  f.AddMlxNic(Root(0x50), {Bdf(0x50, 1)}, Bdf(0x51, 0, 1), 0, "mlx5_5", "enp81s0f1np1",
              eth);
}

InterfaceAddresses DgxAddresses() {
  InterfaceAddresses a;
  for (int i = 0; i < 8; ++i)
    a[absl::StrCat("ib", i)] = {absl::StrCat("10.10.", i, ".2")};
  a["enp81s0f0np0"] = {"192.168.1.10"};
  a["enp81s0f1np1"] = {"192.168.1.11"};
  a["lo"] = {"127.0.0.1"};
  return a;
}

void BuildPcieServer(SysfsFixture& f) {
  for (int half = 0; half < 2; ++half) {
    const int rb = half * 0x80;
    f.AddGpu(Root(rb), {Bdf(rb, 1)}, Bdf(rb + 1), 0);
    f.AddGpu(Root(rb), {Bdf(rb, 2)}, Bdf(rb + 2), 0);
    RdmaPortSpec roce;
    roce.link_layer = "Ethernet";
    roce.rate = "100 Gb/sec (4X EDR)";
    roce.gid_netdev = absl::StrCat("ens", half + 3, "np0");
    f.AddMlxNic(Root(rb), {Bdf(rb, 3)}, Bdf(rb + 3), 0, absl::StrCat("mlx5_", half),
                roce.gid_netdev, roce);
  }
  const std::string onboard =
      f.AddPci(Root(0), {Bdf(0, 0x1c)}, Bdf(0x10), 0, 0x8086, 0x020000);
  f.AddNetdev(onboard, "eno1");
}

InterfaceAddresses PcieServerAddresses() {
  return {{"ens3np0", {"10.1.0.5"}}, {"ens4np0", {"10.1.1.5"}}, {"eno1", {"172.16.0.5"}}};
}

void BuildTwoSocket(SysfsFixture& f) {
  const std::vector<std::string> sw0 = {Bdf(0, 1), Bdf(1)};
  auto port0 = [&](int p) {
    auto v = sw0;
    v.push_back(Bdf(2, p));
    return v;
  };
  f.AddGpu(Root(0), port0(0), Bdf(3), 0);
  f.AddGpu(Root(0), port0(1), Bdf(4), 0);
  f.AddMlxNic(Root(0), port0(2), Bdf(5), 0, "mlx5_0", "ibs5");
  f.AddGpu(Root(0x80), {Bdf(0x80, 1)}, Bdf(0x81), 1);
  const std::vector<std::string> top = {Bdf(0x80, 2), Bdf(0x83)};
  auto under_top = [&](std::vector<std::string> tail) {
    auto v = top;
    v.insert(v.end(), tail.begin(), tail.end());
    return v;
  };
  f.AddGpu(Root(0x80), under_top({Bdf(0x84, 0), Bdf(0x85), Bdf(0x86)}), Bdf(0x87), 1);
  const std::string nic =
      f.AddPci(Root(0x80), under_top({Bdf(0x84, 1)}), Bdf(0x88), 1, 0x15b3, 0x020000);
  f.AddNetdev(nic, "enp136s0", true, 0);
  f.AddNetdev(nic, "enp136s0d1", true, 1);
  RdmaPortSpec p1, p2;
  p1.link_layer = p2.link_layer = "Ethernet";
  p1.rate = p2.rate = "40 Gb/sec (4X QDR)";
  p2.port = 2;
  p2.state = "1: DOWN";
  p2.phys_state = "2: Polling";
  f.AddRdma(nic, "mlx4_0", {p1, p2});
}

InterfaceAddresses TwoSocketAddresses() {
  return {
      {"ibs5", {"10.2.0.1"}}, {"enp136s0", {"10.3.0.1"}}, {"enp136s0d1", {"10.3.1.1"}}};
}

}  // namespace fuselink::topo::testing
