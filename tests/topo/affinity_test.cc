// Path classes from PCI paths, how far GPUDirect reaches, and which GPU owns which NIC.
#include "agent/topo/affinity.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/topo/discovery_checks.h"

namespace fuselink::topo {
namespace {

using ::testing::ElementsAre;
using testing::NODE;
using testing::PHB;
using testing::PIX;
using testing::PXB;
using testing::SYS;
using testing::UNKNOWN;

TEST(Affinity, ClassesFromPciPaths) {
  auto at = [](absl::string_view path, int numa) {
    absl::StatusOr<PciPosition> p = ParsePciPath(path);
    EXPECT_TRUE(p.ok()) << path;
    PciPosition out = p.ok() ? *p : PciPosition{};
    out.numa_node = numa;
    return out;
  };
  const PciPosition gpu =
      at("devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:00.0/0000:1a:00.0", 0);
  EXPECT_EQ(gpu.root, "pci0000:17");
  EXPECT_THAT(gpu.bridges, ElementsAre("0000:17:01.0", "0000:18:00.0", "0000:19:00.0"));
  EXPECT_EQ(gpu.function, "0000:1a:00.0");
  EXPECT_EQ(
      Classify(
          gpu,
          at("devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:01.0/0000:1b:00.0",
             0)),
      PIX);
  EXPECT_EQ(Classify(gpu, at("devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:01.0/"
                             "0000:1b:00.0/0000:1c:00.0/0000:1d:00.0",
                             0)),
            PXB);
  // One switch below the GPU's switch: two bridges below the common one.
  EXPECT_EQ(Classify(gpu, at("devices/pci0000:17/0000:17:01.0/0000:18:00.0/0000:19:01.0/"
                             "0000:1b:00.0/0000:1c:00.0",
                             0)),
            PXB);
  EXPECT_EQ(Classify(gpu, at("devices/pci0000:17/0000:17:02.0/0000:30:00.0", 0)), PHB);
  EXPECT_EQ(Classify(gpu, at("devices/pci0000:40/0000:40:01.0/0000:41:00.0", 0)), NODE);
  EXPECT_EQ(Classify(gpu, at("devices/pci0000:40/0000:40:01.0/0000:41:00.0", 1)), SYS);
  EXPECT_EQ(Classify(gpu, at("devices/pci0000:40/0000:40:01.0/0000:41:00.0", -1)),
            UNKNOWN);  // one NUMA node known, the other not
  PciPosition no_numa = gpu;
  no_numa.numa_node = -1;
  EXPECT_EQ(Classify(no_numa, at("devices/pci0000:40/0000:40:01.0/0000:41:00.0", -1)),
            NODE);  // neither known: one NUMA node
  EXPECT_EQ(Classify(gpu, PciPosition{}), UNKNOWN);
  EXPECT_FALSE(ParsePciPath("devices/virtual/net/lo").ok());
  EXPECT_EQ(ParsePciPath("devices/pci0000:00/0000:00:03.0/virtio2")->function,
            "0000:00:03.0");
  EXPECT_STREQ(PathClassName(NODE), "NODE");
}

// Taken NIC by NIC, NIC 0 (PIX to GPUs 0 and 1) and NIC 1 (PIX to GPU 0 only) both
// went to GPU 0, and GPU 1 had no NIC of its own.
TEST(Affinity, GpuDirectReachesUpToTheLimitAndWhereNobodySays) {
  EXPECT_TRUE(GpuDirectReaches(v1::PATH_CLASS_PIX, v1::PATH_CLASS_PXB));
  EXPECT_TRUE(GpuDirectReaches(v1::PATH_CLASS_PXB, v1::PATH_CLASS_PXB));
  EXPECT_FALSE(GpuDirectReaches(v1::PATH_CLASS_PHB, v1::PATH_CLASS_PXB));
  EXPECT_FALSE(GpuDirectReaches(v1::PATH_CLASS_SYS, v1::PATH_CLASS_NODE));
  EXPECT_TRUE(GpuDirectReaches(v1::PATH_CLASS_SYS, v1::PATH_CLASS_SYS));
  EXPECT_TRUE(GpuDirectReaches(v1::PATH_CLASS_UNSPECIFIED, v1::PATH_CLASS_PIX));
  EXPECT_EQ(ParsePathClass("pxb"), v1::PATH_CLASS_PXB);
  EXPECT_EQ(ParsePathClass("SYS"), v1::PATH_CLASS_SYS);
  EXPECT_EQ(ParsePathClass("?"), std::nullopt);
  EXPECT_EQ(ParsePathClass(""), std::nullopt);
}

TEST(Affinity, EveryGpuGetsANicOfItsOwnWhenTheNicsAllow) {
  Affinity a = ChooseAffinity({{PIX, PIX}, {PIX, NODE}}, 2);
  EXPECT_THAT(a.owner_gpu, ElementsAre(1, 0));
  EXPECT_THAT(a.direct_nic, ElementsAre(1, 0));
  // A longer chain: GPU 2 gets NIC 0 only after GPU 0 moves to NIC 1 and GPU 1 to NIC 2.
  a = ChooseAffinity({{PIX, SYS, PIX}, {PIX, PIX, SYS}, {SYS, PIX, SYS}}, 3);
  EXPECT_THAT(a.direct_nic, ElementsAre(1, 2, 0));
  EXPECT_THAT(a.owner_gpu, ElementsAre(2, 0, 1));
  // A GPU is matched only at its best class: GPU 1 shares NIC 0 (PIX) rather than
  // starting on NIC 1 (NODE); NIC 1 is then owned by its nearest GPU with fewest.
  a = ChooseAffinity({{PIX, PIX}, {NODE, NODE}}, 2);
  EXPECT_THAT(a.direct_nic, ElementsAre(0, 0));
  EXPECT_THAT(a.owner_gpu, ElementsAre(0, 1));
  // Two GPUs want one NIC: the nearer one (PXB) gets it, whatever the index order.
  a = ChooseAffinity({{PHB, PXB}}, 2);
  EXPECT_THAT(a.owner_gpu, ElementsAre(1));
  EXPECT_THAT(a.direct_nic, ElementsAre(0, 0));
  // More NICs than GPUs: the extra ones spread by fewest owned.
  a = ChooseAffinity({{PIX}, {PIX}, {PIX}}, 1);
  EXPECT_THAT(a.owner_gpu, ElementsAre(0, 0, 0));
  EXPECT_THAT(a.direct_nic, ElementsAre(0));
  // No GPUs: the notional GPU 0 owns everything; unknown classes still get a NIC.
  EXPECT_THAT(ChooseAffinity({{}, {}}, 0).owner_gpu, ElementsAre(0, 0));
  EXPECT_THAT(ChooseAffinity({{UNKNOWN, UNKNOWN}}, 2).direct_nic, ElementsAre(0, 0));
}

}  // namespace
}  // namespace fuselink::topo
