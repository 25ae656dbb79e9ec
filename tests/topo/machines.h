// sysfs trees of real machine layouts for discovery's tests, built into a
// SysfsFixture, with the IPv4 addresses their interfaces would have.
#pragma once

#include <string>

#include "agent/topo/discovery.h"
#include "tests/topo/sysfs_fixture.h"

namespace fuselink::topo::testing {

// "0000:bb:dd.f" and "pci0000:bb".
std::string Bdf(int bus, int dev = 0, int fn = 0);
std::string Root(int bus);

// DGX H100/H200-like: 2 sockets, on each 4 host bridges, each with one PCIe switch
// holding one GPU and one ConnectX-7 (InfiniBand NDR, netdev ib<i>); a dual-port
// management / storage ConnectX (RoCE, Ethernet) on a host bridge of socket 0 without
// GPUs. RDMA names as the kernel gives them in PCI order: mlx5_0-3 (socket 0),
// mlx5_4-5 (management), mlx5_6-9 (socket 1). GPU i sits at bus kDgxBus[i] + 3, its
// NIC at + 4, behind root port kDgxBus[i]:01.0, switch kDgxBus[i]+1:00.0 and
// downstream ports kDgxBus[i]+2:00.0 (GPU) and :01.0 (NIC).
inline constexpr int kDgxBus[8] = {0x15, 0x26, 0x37, 0x48, 0x97, 0xa8, 0xb9, 0xca};
void BuildDgx(SysfsFixture& f);
InterfaceAddresses DgxAddresses();

// A 4-GPU PCIe server without switches, one socket with two host bridges: GPU 0, 1
// and a RoCE NIC (mlx5_0, ens3np0) on pci0000:00, GPU 2, 3 and mlx5_1 (ens4np0) on
// pci0000:80; an onboard 1 GbE port (eno1, no RDMA).
void BuildPcieServer(SysfsFixture& f);
InterfaceAddresses PcieServerAddresses();

// Two sockets: on socket 0 a PCIe switch holds GPU 0, GPU 1 and an InfiniBand NIC
// (mlx5_0, ibs5); on socket 1 GPU 2 sits in a root port, and GPU 3 two switch levels
// below another root port whose top switch also holds a dual-port RoCE NIC (mlx4_0,
// one PCI function, netdevs enp136s0 / enp136s0d1 by dev_port, port 2 down).
void BuildTwoSocket(SysfsFixture& f);
InterfaceAddresses TwoSocketAddresses();

}  // namespace fuselink::topo::testing
