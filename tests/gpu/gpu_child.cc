// The other process of the GPU tests (CUDA IPC needs two; VMM fds are meant to cross
// processes). Started by Child::Start with its socket as fd 3:
//   gpu_child vmm-import          receive {size, seed} + fd; import and map the fd;
//                                 check Pattern(seed); write Pattern(seed + 1) through
//                                 this mapping; reply.
//   gpu_child ipc-export SIZE SEED  cuMemAlloc SIZE bytes, fill with Pattern(SEED), send
//                                 the IPC handle; keep the memory until the parent
//                                 closes the socket.
// Replies are a ChildReply. Exit status 0 on success.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "agent/common/status_macros.h"
#include "agent/gpu/ipc.h"
#include "agent/gpu/memory.h"
#include "agent/gpu/vmm.h"
#include "tests/gpu/child_protocol.h"
#include "tests/gpu/gpu_test_util.h"

namespace fuselink::gpu::testing {
namespace {

absl::Status VmmImport(const PrimaryContext& context, Stream& stream) {
  VmmRequest request{};
  UniqueFd fd;
  FL_RETURN_IF_ERROR(ReceiveMessage(kChildSocketFd, &request, sizeof(request), &fd));
  if (!fd.valid()) return absl::InvalidArgumentError("no fd came with the request");
  FL_ASSIGN_OR_RETURN(VmmBuffer buffer,
                      VmmBuffer::ImportFd(context, fd.get(), request.size_bytes));
  fd.reset();  // the import holds the memory now
  FL_ASSIGN_OR_RETURN(std::vector<uint8_t> seen,
                      ReadDevice(stream, buffer.ptr(), request.size_bytes));
  if (seen != Pattern(request.size_bytes, request.seed)) {
    return absl::DataLossError("bytes read through the imported mapping differ");
  }
  FL_RETURN_IF_ERROR(
      WriteDevice(stream, buffer.ptr(), Pattern(request.size_bytes, request.seed + 1)));
  ChildReply reply{};
  return SendMessage(kChildSocketFd, &reply, sizeof(reply));
}

absl::Status IpcExport(const PrimaryContext& context, Stream& stream, uint64_t size_bytes,
                       uint64_t seed) {
  FL_ASSIGN_OR_RETURN(DeviceBuffer buffer, DeviceBuffer::Allocate(context, size_bytes));
  FL_RETURN_IF_ERROR(WriteDevice(stream, buffer.ptr(), Pattern(size_bytes, seed)));
  FL_ASSIGN_OR_RETURN(IpcMemHandle handle, GetIpcMemHandle(context, buffer.ptr()));
  ChildReply reply{};
  std::memcpy(reply.ipc_handle, handle.data(), handle.size());
  FL_RETURN_IF_ERROR(SendMessage(kChildSocketFd, &reply, sizeof(reply)));
  char done = 0;
  (void)ReceiveMessage(kChildSocketFd, &done, 1);  // until the parent is done or gone
  return absl::OkStatus();
}

absl::Status Run(int argc, char** argv) {
  if (argc < 2) return absl::InvalidArgumentError("usage: gpu_child MODE ...");
  FL_ASSIGN_OR_RETURN(const Driver* driver, Driver::Load());
  FL_ASSIGN_OR_RETURN(PrimaryContext context, PrimaryContext::Retain(*driver, 0));
  FL_ASSIGN_OR_RETURN(Stream stream, Stream::Create(context));
  const std::string mode = argv[1];
  if (mode == "vmm-import") return VmmImport(context, stream);
  uint64_t size_bytes = 0;
  uint64_t seed = 0;
  if (mode == "ipc-export" && argc == 4 && absl::SimpleAtoi(argv[2], &size_bytes) &&
      absl::SimpleAtoi(argv[3], &seed)) {
    return IpcExport(context, stream, size_bytes, seed);
  }
  return absl::InvalidArgumentError("unknown mode or bad arguments");
}

}  // namespace
}  // namespace fuselink::gpu::testing

int main(int argc, char** argv) {
  using namespace fuselink::gpu::testing;
  const absl::Status status = Run(argc, argv);
  if (status.ok()) return 0;
  std::fprintf(stderr, "gpu_child: %s\n", status.ToString().c_str());
  ChildReply reply{};
  reply.failed = 1;
  std::snprintf(reply.error, sizeof(reply.error), "%s", status.ToString().c_str());
  (void)SendMessage(kChildSocketFd, &reply, sizeof(reply));
  return 1;
}
