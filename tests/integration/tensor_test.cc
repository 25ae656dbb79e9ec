// The tensor calls of one agent: registration and its errors, paging, lookups.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "agent/common/unique_fd.h"
#include "clients/cpp/scrape.h"
#include "gtest/gtest.h"
#include "services/handle_socket/protocol.h"
#include "services/handle_socket/socket.h"
#include "tests/common/fd_passing.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"

namespace fuselink::testing {
namespace {

constexpr uint64_t kBlockBytes = 16 << 10;

class TensorTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<AgentProcess>> agent =
        AgentProcess::Start(dir_.path(), kNodeB);
    ASSERT_TRUE(agent.ok()) << agent.status();
    b_ = *std::move(agent);
  }

  // Passes `buffer`'s memfd over the handle socket; the token names it once.
  uint64_t Token(const client::HostBuffer& buffer) {
    absl::StatusOr<uint64_t> token = services::SendFd(b_->handle_socket(), buffer.fd());
    EXPECT_TRUE(token.ok()) << token.status();
    return token.value_or(0);
  }

  // A pidfd of this process passed over the handle socket, as an engine proves itself
  // local and names itself the memory's owner (owner_fd_token).
  uint64_t OwnPidfdToken() {
    UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0)));
    EXPECT_TRUE(pidfd.valid()) << strerror(errno);
    absl::StatusOr<uint64_t> token = services::SendFd(b_->handle_socket(), pidfd.get());
    EXPECT_TRUE(token.ok()) << token.status();
    return token.value_or(0);
  }

  grpc::Status Register(const std::string& name, const v1::Layout& layout,
                        uint64_t fd_token, uint64_t size_bytes, v1::Tensor* out) {
    v1::RegisterTensorRequest request;
    request.set_name(name);
    *request.mutable_layout() = layout;
    request.mutable_memory()->mutable_host()->set_fd_token(fd_token);
    request.mutable_memory()->mutable_host()->set_size_bytes(size_bytes);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    return b_->stub().RegisterTensor(&context, request, out);
  }

  grpc::Status Get(const std::string& name, v1::Tensor* out) {
    v1::GetTensorRequest request;
    request.set_name(name);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    return b_->stub().GetTensor(&context, request, out);
  }

  grpc::Status Unregister(const std::string& name) { return UnregisterTensor(*b_, name); }

  // Every page of ListTensors with `page_size`; the names in page order.
  std::vector<std::vector<std::string>> ListPages(uint32_t page_size) {
    std::vector<std::vector<std::string>> pages;
    v1::ListTensorsRequest request;
    request.set_page_size(page_size);
    do {
      v1::ListTensorsResponse response;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
      grpc::Status status = b_->stub().ListTensors(&context, request, &response);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok() || pages.size() > 100) break;
      pages.emplace_back();
      for (const v1::Tensor& t : response.tensors()) pages.back().push_back(t.name());
      request.set_page_token(response.next_page_token());
    } while (!request.page_token().empty());
    return pages;
  }
};

TEST_F(TensorTest, ListsEveryTensorInNameOrderAPageAtATime) {
  std::vector<HostTensor> tensors;
  for (const char* name : {"t-c", "t-a", "t-e", "t-b", "t-d"}) {
    absl::StatusOr<HostTensor> t =
        RegisterTensor(*b_, name, MakeLayout(2, 4, kBlockBytes), tensors.size());
    ASSERT_TRUE(t.ok()) << t.status();
    tensors.push_back(*std::move(t));
  }
  using Pages = std::vector<std::vector<std::string>>;
  EXPECT_EQ(ListPages(2), (Pages{{"t-a", "t-b"}, {"t-c", "t-d"}, {"t-e"}}));
  EXPECT_EQ(ListPages(5), (Pages{{"t-a", "t-b", "t-c", "t-d", "t-e"}}));
  EXPECT_EQ(ListPages(0), (Pages{{"t-a", "t-b", "t-c", "t-d", "t-e"}}));

  ASSERT_TRUE(Unregister("t-c").ok());
  EXPECT_EQ(ListPages(2), (Pages{{"t-a", "t-b"}, {"t-d", "t-e"}}));
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(TensorTest, GetTensorDescribesItAndUnregisterForgetsIt) {
  // Padded: the agent reports the strides it was given; zero strides come back packed.
  const v1::Layout layout = MakeLayout(3, 8, kBlockBytes, kBlockBytes + 512, 0);
  absl::StatusOr<HostTensor> padded = RegisterTensor(*b_, "kv/padded", layout, 7, 3);
  ASSERT_TRUE(padded.ok()) << padded.status();
  v1::Tensor tensor;
  ASSERT_TRUE(Get("kv/padded", &tensor).ok());
  EXPECT_EQ(tensor.name(), "kv/padded");
  EXPECT_EQ(tensor.node(), kNodeB);
  EXPECT_EQ(tensor.memory_kind(), "host");
  EXPECT_EQ(tensor.home_gpu(), 3u);
  EXPECT_EQ(tensor.size_bytes(), padded->buffer->bytes());
  EXPECT_EQ(tensor.layout().layers(), 3u);
  EXPECT_EQ(tensor.layout().blocks_per_layer(), 8u);
  EXPECT_EQ(tensor.layout().block_bytes(), kBlockBytes);
  EXPECT_EQ(tensor.layout().block_stride_bytes(), kBlockBytes + 512);
  EXPECT_EQ(tensor.layout().layer_stride_bytes(), 8 * (kBlockBytes + 512));

  ASSERT_TRUE(Unregister("kv/padded").ok());
  EXPECT_TRUE(
      HasError(Get("kv/padded", &tensor), grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  EXPECT_TRUE(
      HasError(Unregister("kv/padded"), grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  // The name is free again.
  absl::StatusOr<HostTensor> again = RegisterTensor(*b_, "kv/padded", layout, 8);
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(TensorTest, RegisterRefusesLayoutsLargerThanTheMemory) {
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> buffer =
      client::HostBuffer::Create("small", 4 * kBlockBytes);
  ASSERT_TRUE(buffer.ok());
  v1::Tensor tensor;
  // Five blocks in the memory of four.
  EXPECT_TRUE(HasError(Register("too-big", MakeLayout(1, 5, kBlockBytes), Token(**buffer),
                                4 * kBlockBytes, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "LAYOUT_EXCEEDS_MEMORY"));
  // Packed blocks fit, but a layer stride puts the second layer past the end.
  EXPECT_TRUE(
      HasError(Register("too-big", MakeLayout(2, 2, kBlockBytes, 0, 3 * kBlockBytes),
                        Token(**buffer), 4 * kBlockBytes, &tensor),
               grpc::StatusCode::INVALID_ARGUMENT, "LAYOUT_EXCEEDS_MEMORY"));
  EXPECT_TRUE(
      HasError(Get("too-big", &tensor), grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  EXPECT_TRUE(Register("fits", MakeLayout(1, 4, kBlockBytes), Token(**buffer),
                       4 * kBlockBytes, &tensor)
                  .ok());
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(TensorTest, RegisterRefusesATakenName) {
  absl::StatusOr<HostTensor> first =
      RegisterTensor(*b_, "taken", MakeLayout(1, 2, kBlockBytes), 1);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> buffer =
      client::HostBuffer::Create("second", 2 * kBlockBytes);
  ASSERT_TRUE(buffer.ok());
  v1::Tensor tensor;
  EXPECT_TRUE(HasError(Register("taken", MakeLayout(1, 2, kBlockBytes), Token(**buffer),
                                2 * kBlockBytes, &tensor),
                       grpc::StatusCode::ALREADY_EXISTS, "TENSOR_EXISTS"));
  // The first registration is untouched.
  ASSERT_TRUE(Get("taken", &tensor).ok());
  EXPECT_EQ(tensor.size_bytes(), first->buffer->bytes());
  EXPECT_TRUE(Serves(*b_));
}

// The tensor names who lent it, by the kernel's word (SO_PEERCRED on the handle
// socket): this test process, which passed the memfd.
TEST_F(TensorTest, ATensorShowsItsLendersKernelCredentials) {
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> buffer =
      client::HostBuffer::Create("lent", 2 * kBlockBytes);
  ASSERT_TRUE(buffer.ok());
  v1::Tensor registered, got;
  ASSERT_TRUE(Register("lent", MakeLayout(1, 2, kBlockBytes), Token(**buffer),
                       2 * kBlockBytes, &registered)
                  .ok());
  ASSERT_TRUE(Get("lent", &got).ok());
  for (const v1::Tensor* t : {&registered, &got}) {
    EXPECT_EQ(t->lender_pid(), static_cast<uint32_t>(getpid()));
    EXPECT_EQ(t->lender_uid(), getuid());
    EXPECT_EQ(t->lender_gid(), getgid());
  }
  EXPECT_TRUE(Unregister("lent").ok());
}

// One memfd lent as two regions: over one range they are one memory, and the layout's
// two parts would be the same bytes; over two ranges of the file they are apart.
TEST_F(TensorTest, RegisterRefusesTwoRegionsOfOneMemory) {
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> buffer =
      client::HostBuffer::Create("memfd", 4 * kBlockBytes);
  ASSERT_TRUE(buffer.ok());
  auto request = [&](uint64_t second_offset_bytes) {
    v1::RegisterTensorRequest r;
    r.set_name("two-regions");
    v1::Layout* layout = r.mutable_layout();
    layout->set_layers(2);
    layout->set_blocks_per_layer(2);
    layout->set_parts_per_block(1);
    for (uint32_t region : {0u, 1u}) {
      v1::BlockPart* part = layout->add_parts();
      part->set_region(region);
      part->set_bytes(kBlockBytes);
    }
    for (uint64_t offset : {uint64_t{0}, second_offset_bytes}) {
      v1::HostMemory* host = r.add_regions()->mutable_host();
      host->set_fd_token(Token(**buffer));
      host->set_offset_bytes(offset);
      host->set_size_bytes(2 * kBlockBytes);
    }
    return r;
  };
  v1::Tensor tensor;
  for (uint64_t offset : {uint64_t{0}, kBlockBytes}) {  // the same range; half of it
    SCOPED_TRACE(offset);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    EXPECT_TRUE(HasError(b_->stub().RegisterTensor(&context, request(offset), &tensor),
                         grpc::StatusCode::INVALID_ARGUMENT, "ALIASED_REGIONS"));
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  grpc::Status apart =
      b_->stub().RegisterTensor(&context, request(2 * kBlockBytes), &tensor);
  EXPECT_TRUE(apart.ok()) << apart.error_message();
  EXPECT_TRUE(Serves(*b_));
}

// An owner token must name a pidfd: a memfd never polls readable as an exited process
// does, so it would revoke the tensor at once or never.
TEST_F(TensorTest, RegisterRefusesAnOwnerThatIsNoPidfd) {
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> buffer = client::HostBuffer::Create(
                                                          "memfd", 2 * kBlockBytes),
                                                      owner_memfd =
                                                          client::HostBuffer::Create(
                                                              "owner", 4096);
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(owner_memfd.ok());
  v1::RegisterTensorRequest request;
  request.set_name("owned-by-a-memfd");
  *request.mutable_layout() = MakeLayout(1, 2, kBlockBytes);
  request.mutable_memory()->mutable_host()->set_fd_token(Token(**buffer));
  request.mutable_memory()->mutable_host()->set_size_bytes(2 * kBlockBytes);
  request.set_owner_fd_token(Token(**owner_memfd));
  v1::Tensor tensor;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  EXPECT_TRUE(HasError(b_->stub().RegisterTensor(&context, request, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_OWNER_FD"));
  // A real pidfd is accepted.
  UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0)));
  ASSERT_TRUE(pidfd.valid()) << strerror(errno);
  absl::StatusOr<uint64_t> owner = services::SendFd(b_->handle_socket(), pidfd.get());
  ASSERT_TRUE(owner.ok()) << owner.status();
  request.mutable_memory()->mutable_host()->set_fd_token(Token(**buffer));
  request.set_owner_fd_token(*owner);
  grpc::ClientContext context2;
  context2.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
  grpc::Status accepted = b_->stub().RegisterTensor(&context2, request, &tensor);
  EXPECT_TRUE(accepted.ok()) << accepted.error_message();
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(TensorTest, RegisterRefusesUnknownAndUsedFdTokens) {
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> buffer =
      client::HostBuffer::Create("memfd", 2 * kBlockBytes);
  ASSERT_TRUE(buffer.ok());
  const v1::Layout layout = MakeLayout(1, 2, kBlockBytes);
  v1::Tensor tensor;
  EXPECT_TRUE(HasError(Register("no-token", layout, 0, 2 * kBlockBytes, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_FD_TOKEN"));
  EXPECT_TRUE(HasError(
      Register("bogus-token", layout, 0x5eed5eed5eedull, 2 * kBlockBytes, &tensor),
      grpc::StatusCode::INVALID_ARGUMENT, "BAD_FD_TOKEN"));
  const uint64_t token = Token(**buffer);
  ASSERT_TRUE(Register("first-use", layout, token, 2 * kBlockBytes, &tensor).ok());
  EXPECT_TRUE(HasError(Register("second-use", layout, token, 2 * kBlockBytes, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_FD_TOKEN"));
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(TensorTest, RegisterChecksNameHomeGpuAndMemoryBeforeSpendingTheToken) {
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> buffer =
      client::HostBuffer::Create("memfd", 2 * kBlockBytes);
  ASSERT_TRUE(buffer.ok());
  const v1::Layout layout = MakeLayout(1, 2, kBlockBytes);
  const uint64_t token = Token(**buffer);
  v1::Tensor tensor;
  EXPECT_TRUE(HasError(Register("bad name!", layout, token, 2 * kBlockBytes, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_NAME"));
  v1::RegisterTensorRequest request;
  request.set_name("gpu-9");
  *request.mutable_layout() = layout;
  request.set_home_gpu(9);  // the emulated node has GPUs 0 to 3
  request.mutable_memory()->mutable_host()->set_fd_token(token);
  request.mutable_memory()->mutable_host()->set_size_bytes(2 * kBlockBytes);
  grpc::ClientContext context;
  EXPECT_TRUE(HasError(b_->stub().RegisterTensor(&context, request, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_HOME_GPU"));
  request.clear_memory();
  grpc::ClientContext context2;
  EXPECT_TRUE(HasError(b_->stub().RegisterTensor(&context2, request, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_MEMORY"));
  // None of them spent the token.
  EXPECT_TRUE(Register("good", layout, token, 2 * kBlockBytes, &tensor).ok());
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(TensorTest, RegisterRefusesAnEmptyLayoutAndMemoryPastTheFile) {
  absl::StatusOr<std::unique_ptr<client::HostBuffer>> buffer =
      client::HostBuffer::Create("memfd", 2 * kBlockBytes);
  ASSERT_TRUE(buffer.ok());
  v1::Tensor tensor;
  EXPECT_TRUE(HasError(Register("no-layers", MakeLayout(0, 2, kBlockBytes),
                                Token(**buffer), 2 * kBlockBytes, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_LAYOUT"));
  EXPECT_TRUE(HasError(Register("past-the-end", MakeLayout(1, 4, kBlockBytes),
                                Token(**buffer), 4 * kBlockBytes, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_MEMORY"));
  EXPECT_TRUE(Serves(*b_));
}

// Two blocks of GPU memory lent by a made-up CUDA IPC handle, with no owner token.
v1::RegisterTensorRequest IpcRequest() {
  v1::RegisterTensorRequest request;
  request.set_name("kv");
  *request.mutable_layout() = MakeLayout(1, 2, kBlockBytes);
  v1::CudaIpcMemory* ipc = request.mutable_memory()->mutable_cuda_ipc();
  ipc->set_handle(std::string(64, '\x5a'));
  ipc->set_size_bytes(2 * kBlockBytes);
  return request;
}

// The test agent runs with --gpu=off, so GPU memory has nowhere to go, on any machine.
TEST_F(TensorTest, GpuMemoryOnAnAgentWithoutGpusIsAFailedPrecondition) {
  v1::RegisterTensorRequest request = IpcRequest();
  // As a local engine lends it: with its pidfd's token from the handle socket.
  request.set_owner_fd_token(OwnPidfdToken());
  v1::CudaIpcMemory* ipc = request.mutable_memory()->mutable_cuda_ipc();
  v1::Tensor tensor;
  grpc::ClientContext context;
  EXPECT_TRUE(HasError(b_->stub().RegisterTensor(&context, request, &tensor),
                       grpc::StatusCode::FAILED_PRECONDITION, "NO_GPU"));
  ipc->set_gpu(7);
  grpc::ClientContext context2;
  EXPECT_TRUE(HasError(b_->stub().RegisterTensor(&context2, request, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_HOME_GPU"));
  EXPECT_TRUE(Serves(*b_));
}

// A CUDA IPC handle is 64 bytes anyone holding them may open on the node: the agent
// takes one only with a token from its handle socket (a local process whose
// credentials it read), never from a gRPC call alone, whatever the certificate. Said
// before anything else, on an agent with GPUs or without; the agent serves on.
TEST_F(TensorTest, GpuMemoryByIpcHandleWithoutAnOwnerTokenIsRefused) {
  const v1::RegisterTensorRequest request = IpcRequest();
  v1::Tensor tensor;
  grpc::ClientContext context;
  EXPECT_TRUE(HasError(b_->stub().RegisterTensor(&context, request, &tensor),
                       grpc::StatusCode::PERMISSION_DENIED, "OWNER_TOKEN_REQUIRED"));
  // The same as regions.
  v1::RegisterTensorRequest regions = request;
  regions.clear_memory();
  *regions.add_regions() = request.memory();
  grpc::ClientContext context2;
  EXPECT_TRUE(HasError(b_->stub().RegisterTensor(&context2, regions, &tensor),
                       grpc::StatusCode::PERMISSION_DENIED, "OWNER_TOKEN_REQUIRED"));
  // Nothing was registered.
  v1::Tensor got;
  EXPECT_TRUE(HasError(Get("kv", &got), grpc::StatusCode::NOT_FOUND, "UNKNOWN_TENSOR"));
  // Each refusal counted.
  absl::StatusOr<std::string> metrics = client::HttpGet(b_->metrics_url(), kWaitTimeout);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(client::MetricValue(*metrics, "fuselink_gpu_handle_refusals_total",
                                {{"reason", "OWNER_TOKEN_REQUIRED"}})
                .value_or(-1),
            2);
  EXPECT_TRUE(Serves(*b_));
}

// The wait for a closing CUDA IPC import is bounded by a flag; out of its range the
// agent does not start, naming it.
TEST_F(TensorTest, AgentRefusesIpcCloseWaitOutOfRange) {
  for (const std::string flag : {"--ipc_close_wait_ms=0", "--ipc_close_wait_ms=60001"}) {
    absl::StatusOr<std::unique_ptr<AgentProcess>> agent =
        AgentProcess::Start(dir_.path(), "node-x", {flag});
    ASSERT_FALSE(agent.ok()) << flag;
    EXPECT_TRUE(absl::StrContains(agent.status().message(), "--ipc_close_wait_ms"))
        << flag << ": " << agent.status().message();
  }
  absl::StatusOr<std::unique_ptr<AgentProcess>> agent =
      AgentProcess::Start(dir_.path(), "node-x", {"--ipc_close_wait_ms=60000"});
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_TRUE(Serves(**agent));
}

// What is wrong with the request itself is said before whether this node has GPUs.
TEST_F(TensorTest, GpuMemoryWithABadHandleOrNoSizeIsRefusedAnywhere) {
  v1::RegisterTensorRequest request;
  request.set_name("kv");
  *request.mutable_layout() = MakeLayout(1, 2, kBlockBytes);
  v1::CudaIpcMemory* ipc = request.mutable_memory()->mutable_cuda_ipc();
  ipc->set_handle("too short");
  ipc->set_size_bytes(2 * kBlockBytes);
  v1::Tensor tensor;
  grpc::ClientContext context;
  EXPECT_TRUE(HasError(b_->stub().RegisterTensor(&context, request, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_GPU_HANDLE"));
  request.mutable_memory()->mutable_vmm()->set_fd_token(1);  // size_bytes left 0
  grpc::ClientContext context2;
  EXPECT_TRUE(HasError(b_->stub().RegisterTensor(&context2, request, &tensor),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_MEMORY"));
  EXPECT_TRUE(Serves(*b_));
}

// The handle socket refuses, on the same connection, every message but one byte 'F'
// with one descriptor (INVALID_ARGUMENT in the reply, token 0), closes what it was
// sent, and then takes a good message.
TEST_F(TensorTest, HandleSocketRefusesAnythingButOneDescriptorWithF) {
  absl::StatusOr<sockaddr_un> address = [&]() -> absl::StatusOr<sockaddr_un> {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string& path = b_->handle_socket();
    if (path.size() >= sizeof(addr.sun_path)) return absl::InvalidArgumentError(path);
    std::memcpy(addr.sun_path, path.data(), path.size());
    return addr;
  }();
  ASSERT_TRUE(address.ok()) << address.status();
  UniqueFd socket_fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(socket_fd.valid());
  ASSERT_EQ(
      connect(socket_fd.get(), reinterpret_cast<sockaddr*>(&*address), sizeof(*address)),
      0)
      << std::strerror(errno);
  UniqueFd file(open("/dev/null", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(file.valid());
  // Sends `data` with `fds` attached and reads the 16-byte reply.
  auto send = [&](const std::string& data, std::vector<int> fds) {
    EXPECT_EQ(SendWithFds(socket_fd.get(), data, fds), static_cast<ssize_t>(data.size()));
    services::handle_protocol::Reply reply{};
    EXPECT_EQ(recv(socket_fd.get(), reply.data(), reply.size(), MSG_WAITALL),
              static_cast<ssize_t>(reply.size()));
    return services::handle_protocol::DecodeReply(reply);
  };
  EXPECT_EQ(send("G", {file.get()}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(send("F", {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(send("F", {file.get(), file.get()}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<uint64_t> token = send("F", {file.get()});
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_NE(*token, 0u);
  EXPECT_TRUE(Serves(*b_));
}

}  // namespace
}  // namespace fuselink::testing
