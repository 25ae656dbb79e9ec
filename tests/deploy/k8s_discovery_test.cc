// The EndpointSlice -> peers reading of Kubernetes discovery, on slices as the API
// server writes them (discovery.k8s.io/v1, and v1beta1 of Kubernetes 1.20).
#include "services/k8s_discovery.h"

#include "gtest/gtest.h"

namespace fuselink::services {
namespace {

constexpr char kV1[] = R"({
  "metadata": {"name": "fl-fuselink-abcde", "resourceVersion": "42"},
  "addressType": "IPv4",
  "endpoints": [
    {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "nodeName": "gpu-1"},
    {"addresses": ["10.0.0.2"], "conditions": {"ready": false}, "nodeName": "gpu-2"},
    {"addresses": ["10.0.0.3"], "nodeName": "gpu-3"}],
  "ports": [{"name": "metrics", "port": 17351, "protocol": "TCP"},
            {"name": "grpc", "port": 17350, "protocol": "TCP"}]})";

TEST(PeersOfSlice, V1NamesNodesAndTheGrpcPortAndSkipsSelf) {
  absl::StatusOr<PeerSet> peers = PeersOfSlice(kV1, "grpc", "gpu-3");
  ASSERT_TRUE(peers.ok()) << peers.status();
  // Not-ready agents are peers too: they are starting, and connect on first use.
  EXPECT_EQ(*peers, (PeerSet{{"gpu-1", "10.0.0.1:17350"}, {"gpu-2", "10.0.0.2:17350"}}));
}

TEST(PeersOfSlice, V1beta1NamesNodesInTopology) {
  absl::StatusOr<PeerSet> peers = PeersOfSlice(R"({
    "endpoints": [{"addresses": ["127.0.81.1"],
                   "topology": {"kubernetes.io/hostname": "gpu-node-1"}}],
    "ports": [{"name": "grpc", "port": 17350}]})",
                                               "grpc", "other");
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_EQ(*peers, (PeerSet{{"gpu-node-1", "127.0.81.1:17350"}}));
}

TEST(PeersOfSlice, NoPeerWithoutPortAddressOrNode) {
  EXPECT_TRUE(
      PeersOfSlice(R"({"endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "a"}],
                               "ports": [{"name": "metrics", "port": 1}]})",
                   "grpc", "")
          ->empty());
  EXPECT_TRUE(PeersOfSlice(R"({"endpoints": [{"addresses": [], "nodeName": "a"},
                                             {"addresses": ["10.0.0.2"]}],
                               "ports": [{"name": "grpc", "port": 17350}]})",
                           "grpc", "")
                  ->empty());
  EXPECT_TRUE(PeersOfSlice(R"({"endpoints": null, "ports": null})", "grpc", "")->empty());
  EXPECT_TRUE(PeersOfSlice(R"({"ports": [{"name": "grpc", "port": 70000}],
                               "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "a"}]})",
                           "grpc", "")
                  ->empty());
}

TEST(PeersOfSlice, RefusesWhatIsNotJson) {
  EXPECT_EQ(PeersOfSlice("{not json", "grpc", "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fuselink::services
