// Which GPUs discovery sees: CUDA_VISIBLE_DEVICES by index and by UUID, entries the
// driver would ignore, the GPU probe's fallback to sysfs, and the driver's peers.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "agent/common/status_macros.h"
#include "agent/topo/discovery.h"
#include "agent/topo/gpu_probe.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/topo/discovery_checks.h"
#include "tests/topo/machines.h"
#include "tests/topo/sysfs_fixture.h"

namespace fuselink::topo {
namespace {

using testing::Bdf;
using testing::BuildDgx;
using testing::DgxAddresses;
using testing::DgxCudaGpus;
using testing::DirectNics;
using ::testing::ElementsAre;
using testing::Excluded;
using testing::FakeCuda;
using ::testing::HasSubstr;
using testing::kDgxBus;
using testing::NODE;
using testing::Options;
using testing::Owners;
using testing::PIX;
using testing::Row;
using testing::SYS;
using testing::SysfsFixture;

TEST(Discovery, CudaVisibleDevicesByIndexRenumbersGpusAndKeepsTheMachinesView) {
  SysfsFixture f;
  BuildDgx(f);
  DiscoveryOptions o = Options(f, DgxAddresses());
  o.cuda.visible_devices = "6,2";
  o.cuda.device_order = "PCI_BUS_ID";
  absl::StatusOr<Topology> t = DiscoverTopology(o);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->gpus_size(), 2);
  EXPECT_EQ(t->gpus(0).pci_bus_id(), Bdf(kDgxBus[6] + 3));  // CUDA device 0
  EXPECT_EQ(t->gpus(1).pci_bus_id(), Bdf(kDgxBus[2] + 3));
  // Management is judged against every GPU of the machine: the socket-0 NICs of
  // hidden GPUs stay data NICs.
  EXPECT_EQ(t->nics_size(), 8);
  EXPECT_EQ(Excluded(*t).size(), 2u);
  EXPECT_EQ(Row(t->nics(2)), (std::vector<PathClass>{SYS, PIX}));   // mlx5_2
  EXPECT_EQ(Row(t->nics(6)), (std::vector<PathClass>{PIX, SYS}));   // mlx5_8
  EXPECT_EQ(Row(t->nics(4)), (std::vector<PathClass>{NODE, SYS}));  // mlx5_6
  EXPECT_THAT(Owners(*t), ElementsAre(1, 1, 1, 1, 0, 0, 0, 0));
  EXPECT_THAT(DirectNics(*t), ElementsAre(6, 2));
  EXPECT_THAT(absl::StrJoin(t->notes(), "\n"), HasSubstr("CUDA_VISIBLE_DEVICES=6,2"));
}

TEST(Discovery, CudaVisibleDevicesEntriesTheDriverWouldIgnoreAreIgnored) {
  SysfsFixture f;
  BuildDgx(f);
  // As the driver reads them (measured on an H200): entries up to the first that names
  // no GPU; a GPU named twice hides every GPU (cuInit fails); the number at an entry's
  // front is its index; "gpu-" in lower case is no UUID.
  for (const auto& [value, want] :
       std::vector<std::pair<std::string, int>>{{"1,x,2", 1},
                                                {"0,0", 0},
                                                {"0,0,1", 0},
                                                {"3,99,1", 1},
                                                {"", 0},
                                                {"7,-1,0", 1},
                                                {"0abc", 1},
                                                {"0x0", 1},
                                                {"2abc,3", 2},
                                                {"gpu-8cf0d4c4", 0},
                                                {"1,gpu-8cf0d4c4", 1},
                                                {"99999999999999999999", 0}}) {
    DiscoveryOptions o = Options(f, DgxAddresses());
    o.cuda.visible_devices = value;
    absl::StatusOr<Topology> t = DiscoverTopology(o);
    ASSERT_TRUE(t.ok()) << value << ": " << t.status();
    EXPECT_EQ(t->gpus_size(), want) << value;
    if (value == "0abc" || value == "0x0") {
      EXPECT_EQ(t->gpus(0).pci_bus_id(), Bdf(kDgxBus[0] + 3)) << value;
    }
    if (value == "0,0,1") {
      EXPECT_THAT(absl::StrJoin(t->notes(), "\n"), HasSubstr("names GPU 0 twice"));
    }
    if (!value.empty()) {
      EXPECT_THAT(absl::StrJoin(t->notes(), "\n"),
                  HasSubstr("applied by discovery to the GPUs in sysfs"));
    }
  }
  DiscoveryOptions o = Options(f, DgxAddresses());
  o.cuda.visible_devices = "MIG-GPU-8cf0d4c4-1d2e-b3f5-0a0c-8d2bd6dd5a4f/1/0";
  absl::StatusOr<Topology> t = DiscoverTopology(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(t.status()), "MIG_UNSUPPORTED");
  o.cuda.visible_devices = "GPU-8cf0d4c4";  // sysfs knows no UUIDs
  t = DiscoverTopology(o);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(t.status()), "CUDA_VISIBLE_DEVICES");
}

// Stands in for the sysfs fallback of the CUDA probe.
class FixedGpus : public GpuProbe {
 public:
  explicit FixedGpus(int n) : n_(n) {}
  absl::StatusOr<GpuEnumeration> Enumerate() const override {
    GpuEnumeration out;
    for (int i = 0; i < n_; ++i) {
      ProbedGpu g;
      g.ordinal = i;
      out.gpus.push_back(std::move(g));
    }
    return out;
  }

 private:
  int n_;
};

TEST(GpuProbe, NoDeviceUnderCudaVisibleDevicesIsNoGpusNotSysfsGpus) {
  const FixedGpus sysfs(8);
  CudaEnvironment env;
  env.visible_devices = "0,0";
  const absl::Status invalid = WithForeignReason(
      absl::FailedPreconditionError("cuInit: CUDA_ERROR_INVALID_DEVICE (101): invalid "
                                    "device ordinal"),
      "CUDA_ERROR_INVALID_DEVICE");
  absl::StatusOr<GpuEnumeration> got = WithoutCudaDriver(invalid, env, sysfs);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->gpus.empty());
  EXPECT_THAT(absl::StrJoin(got->notes, "\n"),
              HasSubstr("the CUDA driver loaded but shows no GPU"));
  EXPECT_THAT(absl::StrJoin(got->notes, "\n"), HasSubstr("CUDA_VISIBLE_DEVICES=0,0"));
  env.visible_devices = "-1";
  const absl::Status none = WithForeignReason(
      absl::FailedPreconditionError("cuInit: CUDA_ERROR_NO_DEVICE (100): no device"),
      "CUDA_ERROR_NO_DEVICE");
  got = WithoutCudaDriver(none, env, sysfs);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->gpus.empty());
  // No libcuda, or no device with the variable unset: sysfs, and the note says why.
  const absl::Status no_lib = WithReason(
      absl::FailedPreconditionError("no NVIDIA driver: libcuda.so.1 not found"),
      reasons::kNoCudaDriver);
  got = WithoutCudaDriver(no_lib, env, sysfs);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->gpus.size(), 8u);
  EXPECT_THAT(got->notes.front(), HasSubstr("libcuda.so.1 not found"));
  got = WithoutCudaDriver(none, CudaEnvironment{}, sysfs);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->gpus.size(), 8u);
  got = WithoutCudaDriver(no_lib, env, FixedGpus(0));
  ASSERT_TRUE(got.ok());
  EXPECT_THAT(got->notes.front(), HasSubstr("CUDA driver not usable"));  // even empty
}

TEST(Discovery, CudaVisibleDevicesByUuidAndTheDriversPeers) {
  SysfsFixture f;
  BuildDgx(f);
  CudaEnvironment env;
  env.visible_devices = "GPU-000000a3,1";  // a UUID prefix, then an index
  FakeCuda cuda(DgxCudaGpus(), env);
  DiscoveryOptions o = Options(f, DgxAddresses());
  o.gpus = &cuda;
  absl::StatusOr<Topology> t = DiscoverTopology(o);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->gpus_size(), 2);
  EXPECT_EQ(t->gpus(0).uuid(), "GPU-000000a3-7d1f-4c2b-9a3e-0123456789ab");
  EXPECT_EQ(t->gpus(0).pci_bus_id(), Bdf(kDgxBus[3] + 3));
  EXPECT_EQ(t->gpus(0).name(), "NVIDIA H200");
  EXPECT_THAT(t->gpus(0).peer_gpus(), ElementsAre(1));
  EXPECT_EQ(t->gpus(1).pci_bus_id(), Bdf(kDgxBus[1] + 3));
  EXPECT_EQ(Row(t->nics(3)), (std::vector<PathClass>{PIX, NODE}));  // mlx5_3
  EXPECT_EQ(t->nics(3).owner_gpu(), 0u);
  EXPECT_EQ(t->gpus(0).direct_nic(), 3u);
  EXPECT_EQ(t->gpus(1).direct_nic(), 1u);

  env.visible_devices = "GPU-000000a";  // a prefix of all eight
  FakeCuda ambiguous(DgxCudaGpus(), env);
  o.gpus = &ambiguous;
  EXPECT_EQ(ReasonOf(DiscoverTopology(o).status()), "CUDA_VISIBLE_DEVICES");
}

}  // namespace
}  // namespace fuselink::topo
