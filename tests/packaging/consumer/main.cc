// A C++ engine as a user of the installed package writes it: lends a host tensor to
// one agent and an empty one to another, moves every block across as a router, and
// checks the bytes that landed. Built by tests/packaging/install_test.sh against the
// installed CMake package and against pkg-config, never against the source tree.
//
//   consumer PKI_DIR SOURCE_NODE SOURCE_ADDR SOURCE_SOCKET TARGET_NODE TARGET_ADDR
//            TARGET_SOCKET
// PKI_DIR holds ca.crt and the certificates scripts/certs.sh makes for engine e1
// (registers) and router r1 (moves). Exit 0 when the bytes match.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "clients/cpp/client.h"
#include "grpcpp/grpcpp.h"

namespace {

namespace v1 = fuselink::v1;
using fuselink::client::HostBuffer;

constexpr uint32_t kLayers = 4;
constexpr uint32_t kBlocks = 8;
constexpr uint64_t kBlockBytes = 64 << 10;
constexpr uint64_t kTensorBytes = kLayers * kBlocks * kBlockBytes;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Mutual TLS with gRPC's own credentials, as `identity` (e.g. engine-e1) of `pki`.
std::unique_ptr<v1::Agent::Stub> Dial(const std::string& address, const std::string& pki,
                                      const std::string& identity) {
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = ReadFile(pki + "/ca.crt");
  tls.pem_private_key = ReadFile(pki + "/" + identity + ".key");
  tls.pem_cert_chain = ReadFile(pki + "/" + identity + ".crt");
  return v1::Agent::NewStub(grpc::CreateChannel(address, grpc::SslCredentials(tls)));
}

v1::Layout DenseLayout() {
  v1::Layout layout;
  layout.set_layers(kLayers);
  layout.set_blocks_per_layer(kBlocks);
  layout.set_block_bytes(kBlockBytes);
  layout.set_block_stride_bytes(kBlockBytes);
  layout.set_layer_stride_bytes(kBlocks * kBlockBytes);
  return layout;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "consumer: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8)
    return Fail(
        "usage: consumer PKI SRC_NODE SRC_ADDR SRC_SOCK DST_NODE DST_ADDR DST_SOCK");
  const std::string pki = argv[1];
  const std::string source_node = argv[2], source_addr = argv[3], source_socket = argv[4];
  const std::string target_node = argv[5], target_addr = argv[6], target_socket = argv[7];

  auto source = HostBuffer::Create("consumer-source", kTensorBytes);
  auto target = HostBuffer::Create("consumer-target", kTensorBytes);
  if (!source.ok()) return Fail("memfd: " + source.status().ToString());
  if (!target.ok()) return Fail("memfd: " + target.status().ToString());
  fuselink::client::FillPattern((*source)->span(), 34);
  std::memset((*target)->data(), 0, kTensorBytes);

  auto source_engine = Dial(source_addr, pki, "engine-e1");
  auto target_engine = Dial(target_addr, pki, "engine-e1");
  auto registered = fuselink::client::RegisterHostTensor(*source_engine, source_socket,
                                                         "kv", DenseLayout(), **source);
  if (!registered.ok()) return Fail("register source: " + registered.status().ToString());
  registered = fuselink::client::RegisterHostTensor(*target_engine, target_socket, "kv",
                                                    DenseLayout(), **target);
  if (!registered.ok()) return Fail("register target: " + registered.status().ToString());

  v1::TransferRequest request;
  // Request ids are idempotency keys: a second consumer reusing one would be answered
  // with the first one's result, and move nothing.
  request.set_request_id("consumer-" + std::to_string(getpid()));
  request.mutable_source()->set_node(source_node);
  request.mutable_source()->set_tensor("kv");
  request.mutable_target()->set_node(target_node);
  request.mutable_target()->set_tensor("kv");
  for (uint32_t b = 0; b < kBlocks; ++b) {
    request.mutable_source()->add_block_ids(b);
    request.mutable_target()->add_block_ids(kBlocks - 1 -
                                            b);  // reversed: placement shows
  }
  auto router = Dial(source_addr, pki, "router-r1");
  auto outcome = fuselink::client::RunTransfer(*router, request, {}, absl::Seconds(30));
  if (!outcome.status.ok() || !outcome.last.has_completed()) {
    return Fail("transfer: " + outcome.status.ToString() + " " +
                outcome.last.DebugString());
  }
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (uint32_t b = 0; b < kBlocks; ++b) {
      const uint64_t from = (layer * kBlocks + b) * kBlockBytes;
      const uint64_t to = (layer * kBlocks + kBlocks - 1 - b) * kBlockBytes;
      if (std::memcmp((*source)->data() + from, (*target)->data() + to, kBlockBytes) !=
          0) {
        return Fail("layer " + std::to_string(layer) + " block " + std::to_string(b) +
                    " landed wrong");
      }
    }
  }
  if (auto s = fuselink::client::UnregisterTensor(*source_engine, "kv"); !s.ok()) {
    return Fail("unregister: " + s.ToString());
  }
  if (auto s = fuselink::client::UnregisterTensor(*target_engine, "kv"); !s.ok()) {
    return Fail("unregister: " + s.ToString());
  }
  std::printf("consumer: %llu bytes moved %s -> %s and checked\n",
              static_cast<unsigned long long>(kTensorBytes), source_node.c_str(),
              target_node.c_str());
  return 0;
}
