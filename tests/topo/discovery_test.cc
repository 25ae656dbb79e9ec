// Discovery on sysfs trees built here, modelled on real machines: a DGX H100/H200-like
// node, a 4-GPU PCIe server, a two-socket box with PCIe switches under switches, a
// node without RDMA devices; malformed trees; and this machine's own /sys. Which GPUs
// are seen: gpu_visibility_test.cc; path classes and owners: affinity_test.cc.
#include "agent/topo/discovery.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/common/status_macros.h"
#include "agent/topo/affinity.h"
#include "agent/topo/render.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/topo/discovery_checks.h"
#include "tests/topo/machines.h"
#include "tests/topo/sysfs_fixture.h"

namespace fuselink::topo {
namespace {

using testing::Bdf;
using testing::BuildDgx;
using testing::BuildPcieServer;
using testing::BuildTwoSocket;
using testing::DgxAddresses;
using testing::DgxCudaGpus;
using testing::DirectNics;
using ::testing::ElementsAre;
using testing::Excluded;
using testing::FakeCuda;
using ::testing::HasSubstr;
using testing::kDgxBus;
using testing::NicNames;
using testing::NicRails;
using testing::NODE;
using testing::Options;
using testing::Owners;
using testing::PcieServerAddresses;
using testing::PHB;
using testing::PIX;
using testing::PXB;
using testing::Root;
using testing::Row;
using testing::SYS;
using testing::SysfsFixture;
using testing::TwoSocketAddresses;
using testing::UNKNOWN;

TEST(Discovery, DgxNodeFindsEachGpusNicAndLeavesOutManagementPorts) {
  SysfsFixture f;
  BuildDgx(f);
  absl::StatusOr<Topology> t = DiscoverTopology(Options(f, DgxAddresses()));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source(), "discovered");
  ASSERT_EQ(t->gpus_size(), 8);
  EXPECT_THAT(NicNames(*t), ElementsAre("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6",
                                        "mlx5_7", "mlx5_8", "mlx5_9"));
  EXPECT_EQ(Excluded(*t), (std::map<std::string, std::string>{{"mlx5_4", "MANAGEMENT"},
                                                              {"mlx5_5", "MANAGEMENT"}}));
  for (int n = 0; n < 8; ++n) {
    const v1::Nic& nic = t->nics(n);
    ASSERT_EQ(nic.gpu_distance_size(), 8) << nic.name();
    for (int g = 0; g < 8; ++g) {
      const PathClass want = n == g ? PIX : n / 4 == g / 4 ? NODE : SYS;
      EXPECT_EQ(nic.gpu_distance(g), want) << nic.name() << " GPU" << g;
    }
    EXPECT_EQ(nic.pci_bus_id(), Bdf(kDgxBus[n] + 4));
    EXPECT_EQ(nic.numa_node(), n / 4);
    EXPECT_EQ(nic.netdev(), absl::StrCat("ib", n));
    EXPECT_EQ(nic.address(), absl::StrCat("10.10.", n, ".2"));
    EXPECT_EQ(nic.link_layer(), "InfiniBand");
    EXPECT_EQ(nic.rdma_port(), 1u);
    EXPECT_EQ(nic.rate_bytes_per_s(), 50'000'000'000u);
  }
  EXPECT_THAT(Owners(*t), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(DirectNics(*t), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(NicRails(*t),
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));  // management not counted
  for (int g = 0; g < 8; ++g) {
    EXPECT_EQ(t->gpus(g).pci_bus_id(), Bdf(kDgxBus[g] + 3));
    EXPECT_EQ(t->gpus(g).numa_node(), g / 4);
  }
  for (const v1::ExcludedNic& x : t->excluded_nics()) {
    EXPECT_EQ(x.pci_bus_id().substr(0, 10), "0000:51:00");
    EXPECT_THAT(x.detail(), HasSubstr("PCIe switch"));
  }
  EXPECT_EQ(t->excluded_nics(0).netdev(), "enp81s0f0np0");  // from gid_attrs/ndevs
  Topology checked = *t;
  EXPECT_TRUE(ValidateTopology(checked).ok());
  EXPECT_EQ(DirectNic(checked, 5), 5);
}

TEST(Discovery, DownPortsAndOperatorExclusionsAreLeftOutWithReasons) {
  SysfsFixture f;
  BuildDgx(f);
  const std::string port =
      absl::StrCat("devices/", Root(kDgxBus[3]), "/", Bdf(kDgxBus[3], 1), "/",
                   Bdf(kDgxBus[3] + 1), "/", Bdf(kDgxBus[3] + 2, 1), "/",
                   Bdf(kDgxBus[3] + 4), "/infiniband/mlx5_3/ports/1");
  f.Write(port + "/state", "1: DOWN");
  f.Write(port + "/phys_state", "3: Disabled");
  DiscoveryOptions o = Options(f, DgxAddresses());
  o.exclude_nics = {"mlx5_7", "enp81s0f1np1"};  // an RDMA device and a netdev
  absl::StatusOr<Topology> t = DiscoverTopology(o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(NicNames(*t),
              ElementsAre("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_6", "mlx5_8", "mlx5_9"));
  EXPECT_EQ(Excluded(*t),
            (std::map<std::string, std::string>{
                {"mlx5_3", "PORT_DOWN"},
                {"mlx5_4", "MANAGEMENT"},
                {"mlx5_5", "OPERATOR_EXCLUDED"},  // the operator's word first
                {"mlx5_7", "OPERATOR_EXCLUDED"}}));
  for (const v1::ExcludedNic& x : t->excluded_nics()) {
    if (x.name() == "mlx5_3") {
      EXPECT_THAT(x.detail(), HasSubstr("1: DOWN"));
    }
  }
  EXPECT_THAT(Owners(*t), ElementsAre(0, 1, 2, 4, 6, 7));
  // Rails keep their numbers: a peer whose ports are all up refuses this node
  // (RAIL_MISMATCH) instead of pairing mlx5_6 here with its mlx5_3.
  EXPECT_THAT(NicRails(*t), ElementsAre(0, 1, 2, 4, 6, 7));
  SysfsFixture healthy;
  BuildDgx(healthy);
  absl::StatusOr<Topology> all = DiscoverTopology(Options(healthy, DgxAddresses()));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(ReasonOf(CheckRailPairing("healthy", Rails(*t), Rails(*all))),
            "RAIL_MISMATCH");
  // GPU 3 and GPU 5 lost their NICs: each starts on a NIC of its own socket (NODE),
  // the one fewest GPUs start on (each has its own GPU), the lowest index among those.
  EXPECT_THAT(DirectNics(*t), ElementsAre(0, 1, 2, 0, 3, 3, 4, 5));
}

// A netdev without IPv4 is found by its global IPv6 address (RoCE v2 with IPv6 GIDs);
// IPv4 is preferred where both exist.
TEST(Discovery, ANetdevWithOnlyIpv6IsFoundByIt) {
  SysfsFixture f;
  BuildDgx(f);
  InterfaceAddresses addresses = DgxAddresses();
  addresses["ib0"] = {"fd00:10::2"};
  addresses["ib1"].push_back("fd00:11::2");
  absl::StatusOr<Topology> t = DiscoverTopology(Options(f, addresses));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_GE(t->nics_size(), 2);
  EXPECT_EQ(t->nics(0).address(), "fd00:10::2");
  EXPECT_EQ(t->nics(1).address(), "10.10.1.2");
  EXPECT_TRUE(ValidateTopology(*t).ok());
}

TEST(Discovery, NoDataNicIsAnErrorNamingEachReason) {
  SysfsFixture f;
  BuildDgx(f);
  InterfaceAddresses only_management = {{"enp81s0f0np0", {"192.168.1.10"}}};
  absl::StatusOr<Topology> t = DiscoverTopology(Options(f, only_management));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nics_size(), 0);
  const absl::Status s = RequireDataNics(*t);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(s), "NO_DATA_NIC");
  EXPECT_THAT(s.message(),
              HasSubstr("mlx5_0: NO_IPV4 (ib0 has no IPv4 or global IPv6 address)"));
  EXPECT_THAT(s.message(), HasSubstr("mlx5_4: MANAGEMENT"));

  SysfsFixture empty;
  t = DiscoverTopology(Options(empty, {}));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(RequireDataNics(*t).message(), HasSubstr("no RDMA port"));
  DiscoveryOptions missing = Options(empty, {});
  missing.sysfs_root = empty.root() + "/no-such-dir";
  t = DiscoverTopology(missing);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->nics_size() + t->gpus_size() + t->excluded_nics_size(), 0);
}

// machines.h: BuildPcieServer.
TEST(Discovery, PcieServerSharesEachNicBetweenTheGpusOfItsHostBridge) {
  SysfsFixture f;
  BuildPcieServer(f);
  absl::StatusOr<Topology> t = DiscoverTopology(Options(f, PcieServerAddresses()));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(NicNames(*t), ElementsAre("mlx5_0", "mlx5_1"));
  EXPECT_TRUE(t->excluded_nics().empty());  // no NIC is GPU-local: none is management
  EXPECT_EQ(Row(t->nics(0)), (std::vector<PathClass>{PHB, PHB, NODE, NODE}));
  EXPECT_EQ(Row(t->nics(1)), (std::vector<PathClass>{NODE, NODE, PHB, PHB}));
  EXPECT_THAT(Owners(*t), ElementsAre(0, 2));
  EXPECT_THAT(DirectNics(*t), ElementsAre(0, 0, 1, 1));
  EXPECT_EQ(t->nics(0).link_layer(), "Ethernet");
  EXPECT_EQ(t->nics(1).netdev(), "ens4np0");
  EXPECT_EQ(t->nics(1).address(), "10.1.1.5");
  EXPECT_EQ(t->nics(1).rate_bytes_per_s(), 12'500'000'000u);
}

// machines.h: BuildTwoSocket.
TEST(Discovery, TwoSocketBoxCrossesTheSocketLinkAndSwitchesUnderSwitches) {
  SysfsFixture f;
  BuildTwoSocket(f);
  absl::StatusOr<Topology> t = DiscoverTopology(Options(f, TwoSocketAddresses()));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_THAT(NicNames(*t), ElementsAre("mlx4_0", "mlx5_0"));
  EXPECT_EQ(Row(t->nics(0)), (std::vector<PathClass>{SYS, SYS, PHB, PXB}));
  EXPECT_EQ(Row(t->nics(1)), (std::vector<PathClass>{PIX, PIX, SYS, SYS}));
  EXPECT_THAT(Owners(*t), ElementsAre(3, 0));
  EXPECT_THAT(DirectNics(*t), ElementsAre(1, 1, 0, 0));
  EXPECT_EQ(t->nics(0).link_layer(), "Ethernet");
  EXPECT_EQ(t->nics(0).netdev(), "enp136s0");
  EXPECT_EQ(t->nics(1).link_layer(), "InfiniBand");
  EXPECT_EQ(t->nics(0).numa_node(), 1);
  ASSERT_EQ(t->excluded_nics_size(), 1);
  const v1::ExcludedNic& down = t->excluded_nics(0);
  EXPECT_EQ(down.name(), "mlx4_0-p2");
  EXPECT_EQ(down.rdma_port(), 2u);
  EXPECT_EQ(down.netdev(), "enp136s0d1");  // by dev_port
  EXPECT_EQ(down.reason(), "PORT_DOWN");
  EXPECT_THAT(down.detail(), HasSubstr("2: Polling"));
}

// No RDMA device: the data NICs are the physical interfaces that are up with IPv4.
TEST(Discovery, TcpNodeUsesPhysicalInterfacesThatAreUpWithIpv4) {
  SysfsFixture f;
  f.AddGpu(Root(0), {Bdf(0, 2)}, Bdf(1), -1);
  // virtio under a PCI function, as on a VM: the function is the position.
  const std::string virtio = f.AddPci(Root(0), {}, Bdf(0, 3), -1, 0x1af4, 0x020000);
  f.AddNetdev(virtio + "/virtio2", "eth0", true, 0, 25000);
  f.Symlink(virtio + "/virtio2/net/eth0", "class/net/eth0");
  f.AddNetdev(f.AddPci(Root(0), {}, Bdf(0, 4), -1, 0x8086, 0x020000), "eth1", false);
  // eth2 is up with only an IPv6 address: the lookup (IPv4 only) has no entry for it.
  f.AddNetdev(f.AddPci(Root(0), {}, Bdf(0, 5), -1, 0x8086, 0x020000), "eth2");
  f.Write("devices/virtual/net/docker0/flags", "0x1003");
  f.Symlink("devices/virtual/net/docker0", "class/net/docker0");
  f.Write("devices/virtual/net/lo/flags", "0x9");
  f.Symlink("devices/virtual/net/lo", "class/net/lo");
  absl::StatusOr<Topology> t =
      DiscoverTopology(Options(f, {{"eth0", {"192.0.2.7", "192.0.2.8"}},
                                   {"docker0", {"172.17.0.1"}},
                                   {"lo", {"127.0.0.1"}}}));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_THAT(NicNames(*t), ElementsAre("eth0"));
  EXPECT_EQ(t->nics(0).address(), "192.0.2.7");  // the primary address
  EXPECT_EQ(t->nics(0).pci_bus_id(), Bdf(0, 3));
  EXPECT_EQ(t->nics(0).rate_bytes_per_s(), 25000ull * 1000000 / 8);
  EXPECT_EQ(t->nics(0).rdma_device(), "");
  EXPECT_EQ(Row(t->nics(0)), (std::vector<PathClass>{PHB}));  // a flat VM tree
  EXPECT_EQ(Excluded(*t), (std::map<std::string, std::string>{{"eth1", "NETDEV_DOWN"},
                                                              {"eth2", "NO_IPV4"}}));
  Topology checked = *t;
  EXPECT_TRUE(ValidateTopology(checked).ok());
}

TEST(Discovery, MalformedSysfsGivesReasonsOrUnknownsNeverAnError) {
  SysfsFixture f;
  BuildDgx(f);
  auto nic_dir = [](int i) {
    const int b = kDgxBus[i];
    return absl::StrCat("devices/", Root(b), "/", Bdf(b, 1), "/", Bdf(b + 1), "/",
                        Bdf(b + 2, 1), "/", Bdf(b + 4));
  };
  f.Write(nic_dir(1) + "/infiniband/mlx5_1/ports/1/state", "garbage");
  f.Write(nic_dir(2) + "/infiniband/mlx5_2/ports/1/rate", "fast");
  f.Write(nic_dir(0) + "/numa_node", "not-a-number");
  f.Write(nic_dir(0) + "/infiniband/mlx5_0/ports/xyz/state", "4: ACTIVE");
  // mlx5_6 loses its device link (as Soft-RoCE has none): its netdev comes from
  // gid_attrs, its position from the netdev.
  f.Remove(nic_dir(4) + "/infiniband/mlx5_6/device");
  f.Write(nic_dir(4) + "/infiniband/mlx5_6/ports/1/gid_attrs/ndevs/0", "ib4");
  // mlx5_7's device link dangles and it has no netdev: position unknown.
  f.Remove(nic_dir(5) + "/infiniband/mlx5_7/device");
  f.Remove(nic_dir(5) + "/net");
  f.Remove("class/net/ib5");
  std::filesystem::create_directory_symlink(
      "../no/such/device", f.root() + "/" + nic_dir(5) + "/infiniband/mlx5_7/device");
  absl::StatusOr<Topology> t = DiscoverTopology(Options(f, DgxAddresses()));
  ASSERT_TRUE(t.ok()) << t.status();
  const auto excluded = Excluded(*t);
  EXPECT_EQ(excluded.at("mlx5_1"), "BAD_SYSFS");
  EXPECT_EQ(excluded.at("mlx5_0-pxyz"), "BAD_SYSFS");
  {  // The operator's word comes before BAD_SYSFS, as design.md orders them.
    DiscoveryOptions o = Options(f, DgxAddresses());
    o.exclude_nics = {"mlx5_0"};
    absl::StatusOr<Topology> x = DiscoverTopology(o);
    ASSERT_TRUE(x.ok()) << x.status();
    EXPECT_EQ(Excluded(*x).at("mlx5_0-pxyz"), "OPERATOR_EXCLUDED");
  }
  EXPECT_EQ(excluded.at("mlx5_7"), "NO_NETDEV");
  EXPECT_FALSE(excluded.contains("mlx5_0"));
  const std::vector<std::string> names = NicNames(*t);
  ASSERT_THAT(names,
              ElementsAre("mlx5_0", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_8", "mlx5_9"));
  EXPECT_EQ(t->nics(0).numa_node(), -1);
  EXPECT_EQ(t->nics(1).rate_bytes_per_s(), 0u);
  EXPECT_EQ(t->nics(3).pci_bus_id(), Bdf(kDgxBus[4] + 4));  // mlx5_6, via ib4
  EXPECT_EQ(t->nics(3).gpu_distance(4), PIX);

  // A GPU the probe names but sysfs does not hold: its classes are unknown, noted.
  std::vector<ProbedGpu> gpus = DgxCudaGpus();
  gpus[7].pci_bus_id = "0000:ee:00.0";
  FakeCuda cuda(gpus, {});
  DiscoveryOptions o = Options(f, DgxAddresses());
  o.gpus = &cuda;
  t = DiscoverTopology(o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->gpus(7).numa_node(), -1);
  for (const v1::Nic& n : t->nics()) EXPECT_EQ(n.gpu_distance(7), UNKNOWN) << n.name();
  EXPECT_THAT(absl::StrJoin(t->notes(), "\n"), HasSubstr("0000:ee:00.0"));
}

// A node with `nics` RDMA devices mlx5_0, mlx5_1, ... each on its own root port of
// one host bridge (no switches: none is management), netdev ib<i>, address
// 10.20.<i>.1, and `gpus` GPUs on other root ports.
InterfaceAddresses BuildWide(SysfsFixture& f, int nics, int gpus) {
  InterfaceAddresses a;
  for (int i = 0; i < nics; ++i) {
    const std::string netdev = absl::StrCat("ib", i);
    f.AddMlxNic(Root(0), {Bdf(0, 1 + i)}, Bdf(0x10 + i), 0, absl::StrCat("mlx5_", i),
                netdev);
    a[netdev] = {absl::StrCat("10.20.", i, ".1")};
  }
  for (int g = 0; g < gpus; ++g)
    f.AddGpu(Root(0x80), {Bdf(0x80, 1 + g)}, Bdf(0x81 + g), 0);
  return a;
}

TEST(Discovery, NamesSortWithNumbersAsNumbersAndNicsPastTheBoundAreLeftOut) {
  SysfsFixture f;
  const InterfaceAddresses a = BuildWide(f, kMaxNics + 2, 1);
  absl::StatusOr<Topology> t = DiscoverTopology(Options(f, a));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->nics_size(), kMaxNics);
  for (int i = 0; i < kMaxNics; ++i) {  // mlx5_2 before mlx5_10, not after
    EXPECT_EQ(t->nics(i).name(), absl::StrCat("mlx5_", i));
    EXPECT_EQ(t->nics(i).netdev(), absl::StrCat("ib", i));
    EXPECT_EQ(t->nics(i).rail(), static_cast<uint32_t>(i));
  }
  EXPECT_EQ(Excluded(*t), (std::map<std::string, std::string>{
                              {absl::StrCat("mlx5_", kMaxNics), "TOO_MANY_NICS"},
                              {absl::StrCat("mlx5_", kMaxNics + 1), "TOO_MANY_NICS"}}));
  Topology checked = *t;
  EXPECT_TRUE(ValidateTopology(checked).ok());
}

TEST(Discovery, MoreGpusThanTheBoundIsAnError) {
  SysfsFixture f;
  const InterfaceAddresses a = BuildWide(f, 1, kMaxGpus + 1);
  absl::StatusOr<Topology> t = DiscoverTopology(Options(f, a));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(t.status()), "TOO_MANY_GPUS");
  DiscoveryOptions o = Options(f, a);
  o.cuda.visible_devices = "0,1";  // narrowed: fine
  t = DiscoverTopology(o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->gpus_size(), 2);
}

TEST(Discovery, RatesWithFractionsAndMalformedRates) {
  SysfsFixture f;
  InterfaceAddresses a = BuildWide(f, 4, 0);
  f.Write("class/infiniband/mlx5_0/ports/1/rate", "2.5 Gb/sec (1X SDR)");
  f.Write("class/infiniband/mlx5_1/ports/1/rate", "13.64 Gb/sec (1X FDR)");
  f.Write("class/infiniband/mlx5_2/ports/1/rate", "-5 Gb/sec");
  f.Write("class/infiniband/mlx5_3/ports/1/rate", "100 Mb/sec");
  absl::StatusOr<Topology> t = DiscoverTopology(Options(f, a));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->nics_size(), 4);
  EXPECT_EQ(t->nics(0).rate_bytes_per_s(), 312'500'000u);
  EXPECT_EQ(t->nics(1).rate_bytes_per_s(), 1'705'000'000u);
  EXPECT_EQ(t->nics(2).rate_bytes_per_s(), 0u);
  EXPECT_EQ(t->nics(3).rate_bytes_per_s(), 0u);
}

TEST(Sysfs, ReadAndResolveFailures) {
  SysfsFixture f;
  f.Write("class/net/eth0/flags", "0x1003");
  const Sysfs sysfs(f.root());
  EXPECT_EQ(*sysfs.Read("class/net/eth0/flags"), "0x1003");
  EXPECT_EQ(sysfs.Read("class/net/eth9/flags").status().code(),
            absl::StatusCode::kNotFound);
  // A directory cannot be read: FAILED_PRECONDITION, as for the kernel's EINVAL.
  EXPECT_EQ(sysfs.Read("class/net").status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Longer than any attribute: refused, not read whole.
  f.Write("class/net/eth0/huge", std::string(kMaxAttributeBytes + 1, 'x'));
  EXPECT_EQ(sysfs.Read("class/net/eth0/huge").status().code(),
            absl::StatusCode::kFailedPrecondition);
  f.Write("class/net/eth0/big", std::string(kMaxAttributeBytes - 1, 'y'));
  EXPECT_EQ(sysfs.Read("class/net/eth0/big")->size(), kMaxAttributeBytes - 1);
  EXPECT_EQ(sysfs.ReadInt("class/net/eth0/big").status().code(),
            absl::StatusCode::kInvalidArgument);
  // A link out of the tree: FAILED_PRECONDITION, and no position.
  std::filesystem::create_directory_symlink("/tmp", f.root() + "/class/net/outside");
  EXPECT_EQ(sysfs.Resolve("class/net/outside").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(sysfs.Position("class/net/outside").ok());
  EXPECT_EQ(sysfs.Resolve("class/net/none").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*sysfs.Resolve("class/net/eth0"), "class/net/eth0");
}

// Where a port's address lives: on a child netdev (RoCE over a VLAN, an IPoIB child),
// never on another port's netdev; one address is one NIC.
TEST(Discovery, PortAddressIsOnItsOwnNetdevPreferringOneWithIpv4) {
  {  // RoCE: the VLAN child in gid_attrs/ndevs carries the address, not the parent.
    SysfsFixture f;
    BuildPcieServer(f);
    f.Write("class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/1", "ens3np0.100");
    InterfaceAddresses a = PcieServerAddresses();
    a.erase("ens3np0");
    a["ens3np0.100"] = {"10.1.100.5"};
    absl::StatusOr<Topology> t = DiscoverTopology(Options(f, a));
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_THAT(NicNames(*t), ElementsAre("mlx5_0", "mlx5_1"));
    EXPECT_EQ(t->nics(0).netdev(), "ens3np0.100");
    EXPECT_EQ(t->nics(0).address(), "10.1.100.5");
  }
  {  // InfiniBand: an IPoIB child under device/net (same dev_port) has the address.
    SysfsFixture f;
    BuildDgx(f);
    const int b = kDgxBus[0];
    f.AddNetdev(absl::StrCat("devices/", Root(b), "/", Bdf(b, 1), "/", Bdf(b + 1), "/",
                             Bdf(b + 2, 1), "/", Bdf(b + 4)),
                "ib0.8001", true, 0, -1, 32);
    InterfaceAddresses a = DgxAddresses();
    a.erase("ib0");
    a["ib0.8001"] = {"10.10.80.2"};
    absl::StatusOr<Topology> t = DiscoverTopology(Options(f, a));
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->nics_size(), 8);
    EXPECT_EQ(t->nics(0).netdev(), "ib0.8001");
    EXPECT_EQ(t->nics(0).address(), "10.10.80.2");
    a.erase("ib0.8001");  // neither has one: both named
    t = DiscoverTopology(Options(f, a));
    ASSERT_TRUE(t.ok()) << t.status();
    for (const v1::ExcludedNic& x : t->excluded_nics()) {
      if (x.name() == "mlx5_0") {
        EXPECT_EQ(x.reason(), "NO_IPV4");
        EXPECT_EQ(x.detail(), "ib0, ib0.8001 have no IPv4 or global IPv6 address");
      }
    }
  }
  {  // A 2-port device with one netdev: port 2 has none, not port 1's.
    SysfsFixture f;
    BuildTwoSocket(f);
    f.Write("class/infiniband/mlx4_0/ports/2/state", "4: ACTIVE");
    f.Remove("class/net/enp136s0d1");
    f.Remove("class/infiniband/mlx4_0/device/net/enp136s0d1");
    absl::StatusOr<Topology> t = DiscoverTopology(Options(f, TwoSocketAddresses()));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_THAT(NicNames(*t), ElementsAre("mlx4_0", "mlx5_0"));
    EXPECT_EQ(Excluded(*t),
              (std::map<std::string, std::string>{{"mlx4_0-p2", "NO_NETDEV"}}));
  }
  {  // Two ports on one address: the second is left out.
    SysfsFixture f;
    BuildTwoSocket(f);
    f.Write("class/infiniband/mlx4_0/ports/2/state", "4: ACTIVE");
    InterfaceAddresses a = TwoSocketAddresses();
    a["enp136s0d1"] = a["enp136s0"];
    absl::StatusOr<Topology> t = DiscoverTopology(Options(f, a));
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_THAT(NicNames(*t), ElementsAre("mlx4_0", "mlx5_0"));
    ASSERT_EQ(t->excluded_nics_size(), 1);
    EXPECT_EQ(t->excluded_nics(0).reason(), "DUPLICATE_ADDRESS");
    EXPECT_EQ(t->excluded_nics(0).detail(),
              "enp136s0d1's address 10.3.0.1 is mlx4_0's too");
  }
}

TEST(Render, ShowsTheMatrixOwnersAndReasons) {
  SysfsFixture f;
  BuildDgx(f);
  absl::StatusOr<Topology> t = DiscoverTopology(Options(f, DgxAddresses()));
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string text = RenderTopology(*t);
  EXPECT_THAT(text, HasSubstr("source discovered"));
  EXPECT_THAT(
      text,
      HasSubstr("  mlx5_0     PIX*   NODE   NODE   NODE   SYS    SYS    SYS    SYS"));
  EXPECT_THAT(text, HasSubstr("mlx5_4"));
  EXPECT_THAT(text, HasSubstr("MANAGEMENT"));
  // Discovery knows no transport: no GPU memory paths until the agent adds them.
  EXPECT_THAT(text, Not(HasSubstr("GPU memory x NIC")));
  for (int k = 0; k < t->nics_size(); ++k) {
    for (int g = 0; g < t->gpus_size(); ++g) {
      t->mutable_nics(k)->add_gpu_memory_path(k == g ? "dma-buf" : "staged");
    }
  }
  EXPECT_THAT(RenderTopology(*t),
              HasSubstr("  mlx5_0     dma-buf     staged      staged      staged"));
}

// Not a check: how long one discovery takes on each fixture (docs/benchmarks.md).
// Disabled in the unit run; run it with
//   discovery_test --gtest_also_run_disabled_tests --gtest_filter='*DiscoveryTime*'
TEST(DiscoveryTime, DISABLED_OnEachFixture) {
  struct Case {
    const char* name;
    void (*build)(SysfsFixture&);
    InterfaceAddresses (*addresses)();
  };
  for (const Case& c :
       {Case{"dgx (8 GPUs, 10 RDMA ports)", BuildDgx, DgxAddresses},
        Case{"pcie-server (4 GPUs, 2 ports)", BuildPcieServer, PcieServerAddresses},
        Case{"two-socket (4 GPUs, 3 ports)", BuildTwoSocket, TwoSocketAddresses}}) {
    SysfsFixture f;
    c.build(f);
    const DiscoveryOptions o = Options(f, c.addresses());
    constexpr int kRuns = 50;
    std::vector<double> ms;
    for (int i = 0; i < kRuns; ++i) {
      const absl::Time start = absl::Now();
      ASSERT_TRUE(DiscoverTopology(o).ok());
      ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    std::sort(ms.begin(), ms.end());
    std::printf(
        "discovery time, %-30s median %.3f ms, min %.3f ms, max %.3f ms (%d runs)\n",
        c.name, ms[kRuns / 2], ms.front(), ms.back(), kRuns);
  }
}

// This machine's own /sys and addresses: whatever is found must hang together, and
// the interfaces must be exactly what a plain reading of /sys and getifaddrs gives.
TEST(Discovery, ThisMachine) {
  DiscoveryOptions o;
  absl::StatusOr<Topology> t = DiscoverTopology(o);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<InterfaceAddresses> addresses = SystemAddresses();
  ASSERT_TRUE(addresses.ok());
  for (const auto& [name, list] : *addresses) {  // lo's ::1, fe80:: are left out
    bool ipv6_seen = false;
    for (const std::string& a : list) {
      EXPECT_TRUE(IsNicAddress(a)) << name << " " << a;
      in_addr v4{};
      const bool ipv4 = inet_pton(AF_INET, a.c_str(), &v4) == 1;
      EXPECT_FALSE(ipv4 && ipv6_seen) << name << ": IPv4 " << a << " after IPv6";
      ipv6_seen |= !ipv4;
    }
  }
  std::set<std::string> names;
  for (const v1::Nic& n : t->nics()) {
    EXPECT_TRUE(names.insert(n.name()).second) << n.name();
    EXPECT_EQ(n.gpu_distance_size(), t->gpus_size()) << n.name();
    EXPECT_LT(n.owner_gpu(), std::max(1, t->gpus_size()));
    ASSERT_TRUE(addresses->contains(n.netdev())) << n.name();
    EXPECT_EQ(addresses->at(n.netdev()).front(), n.address());
    EXPECT_TRUE(std::filesystem::exists("/sys/class/net/" + n.netdev() + "/device"));
  }
  static const std::set<std::string> kReasons = {
      "PORT_DOWN",         "NETDEV_DOWN",   "NO_NETDEV", "NO_IPV4",          "MANAGEMENT",
      "OPERATOR_EXCLUDED", "TOO_MANY_NICS", "BAD_SYSFS", "DUPLICATE_ADDRESS"};
  for (const v1::ExcludedNic& x : t->excluded_nics()) {
    EXPECT_TRUE(kReasons.contains(x.reason())) << x.name() << " " << x.reason();
    EXPECT_TRUE(names.insert(x.name()).second)
        << x.name() << " is both used and excluded";
  }
  for (const v1::Gpu& g : t->gpus()) {
    EXPECT_TRUE(std::filesystem::exists("/sys/bus/pci/devices/" + g.pci_bus_id()));
    if (t->nics_size() > 0) {
      EXPECT_LT(g.direct_nic(), static_cast<uint32_t>(t->nics_size()));
    }
  }
  if (!std::filesystem::exists("/sys/class/infiniband") ||
      std::filesystem::is_empty("/sys/class/infiniband")) {
    // No RDMA: the candidates are the physical interfaces, read here independently.
    std::set<std::string> expected, found;
    for (const auto& e : std::filesystem::directory_iterator("/sys/class/net")) {
      const std::string name = e.path().filename();
      if (name == "lo" || !std::filesystem::exists(e.path() / "device")) continue;
      std::ifstream flags(e.path() / "flags"), oper(e.path() / "operstate");
      unsigned long value = 0;
      std::string state;
      flags >> std::hex >> value;
      oper >> state;
      if ((value & 1) && state != "down" && addresses->contains(name))
        expected.insert(name);
    }
    for (const v1::Nic& n : t->nics()) found.insert(n.netdev());
    EXPECT_EQ(found, expected);
  }
  if (t->nics_size() == 0) {
    EXPECT_EQ(ReasonOf(RequireDataNics(*t)), "NO_DATA_NIC");
  } else {
    Topology checked = *t;
    EXPECT_TRUE(ValidateTopology(checked).ok()) << ValidateTopology(checked);
  }
  std::printf("%s", RenderTopology(*t).c_str());
}

}  // namespace
}  // namespace fuselink::topo
