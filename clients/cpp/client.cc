#include "clients/cpp/client.h"

#include <sys/mman.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/common/grpc_status.h"
#include "agent/common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "services/handle_socket/socket.h"

namespace fuselink::client {

absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::Create(const std::string& name,
                                                               uint64_t bytes) {
  UniqueFd fd(memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus("memfd_create", errno);
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return ErrnoStatus("ftruncate(memfd)", errno);
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (data == MAP_FAILED) return ErrnoStatus("mmap(memfd)", errno);
  // Before anything touches it: where the node allows huge pages for shared memory,
  // the buffer is made of them, and a first transfer into it runs as fast as the later
  // ones (docs/benchmarks.md, "Huge pages"). Advice; ignored elsewhere.
  madvise(data, bytes, MADV_HUGEPAGE);
  return std::unique_ptr<HostBuffer>(
      new HostBuffer(std::move(fd), static_cast<uint8_t*>(data), bytes));
}

HostBuffer::~HostBuffer() { munmap(data_, bytes_); }

void FillPattern(std::span<uint8_t> bytes, uint64_t seed) {
  // splitmix64 of (seed, 8-byte word index): cheap, and any misplaced word shows.
  const size_t words = bytes.size() / 8;
  auto* w = reinterpret_cast<uint64_t*>(bytes.data());
  for (size_t i = 0; i < words; ++i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    w[i] = z ^ (z >> 31);
  }
  for (size_t i = words * 8; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>(seed + i);
}

absl::StatusOr<v1::Tensor> RegisterHostTensor(v1::Agent::Stub& agent,
                                              const std::string& handle_socket,
                                              const std::string& name,
                                              const v1::Layout& layout,
                                              const HostBuffer& buffer, uint32_t home_gpu,
                                              int owner_pidfd) {
  FL_ASSIGN_OR_RETURN(uint64_t token, services::SendFd(handle_socket, buffer.fd()));
  v1::RegisterTensorRequest request;
  if (owner_pidfd >= 0) {
    FL_ASSIGN_OR_RETURN(uint64_t owner, services::SendFd(handle_socket, owner_pidfd));
    request.set_owner_fd_token(owner);
  }
  request.set_name(name);
  *request.mutable_layout() = layout;
  request.set_home_gpu(home_gpu);
  v1::HostMemory* host = request.mutable_memory()->mutable_host();
  host->set_fd_token(token);
  host->set_size_bytes(buffer.bytes());
  v1::Tensor tensor;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status status = agent.RegisterTensor(&context, request, &tensor);
  if (!status.ok()) return FromGrpcStatus(status);
  return tensor;
}

TransferOutcome RunTransfer(v1::Agent::Stub& agent, const v1::TransferRequest& request,
                            const std::function<void(const v1::TransferEvent&)>& on_event,
                            absl::Duration timeout) {
  TransferOutcome outcome;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  std::unique_ptr<grpc::ClientReader<v1::TransferEvent>> reader =
      agent.TransferKVCache(&context, request);
  v1::TransferEvent event;
  while (reader->Read(&event)) {
    ++outcome.events;
    if (on_event) on_event(event);
    outcome.last = event;
  }
  outcome.status = FromGrpcStatus(reader->Finish());
  return outcome;
}

absl::Status UnregisterTensor(v1::Agent::Stub& agent, const std::string& name) {
  v1::UnregisterTensorRequest request;
  request.set_name(name);
  v1::UnregisterTensorResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return FromGrpcStatus(agent.UnregisterTensor(&context, request, &response));
}

namespace {

// Appends code point `c` (< 0x10000) as UTF-8.
void AppendUtf8(uint32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
}

}  // namespace

std::string ReadyField(const std::string& json, const std::string& key) {
  const std::string open = absl::StrCat("\"", key, "\":\"");
  size_t at = json.find(open);
  if (at == std::string::npos) return "";
  std::string value;
  for (at += open.size(); at < json.size(); ++at) {
    const char c = json[at];
    if (c == '"') return value;
    if (c != '\\') {
      value += c;
      continue;
    }
    if (++at == json.size()) return "";
    switch (const char e = json[at]; e) {
      case 'b':
        value += '\b';
        break;
      case 'f':
        value += '\f';
        break;
      case 'n':
        value += '\n';
        break;
      case 'r':
        value += '\r';
        break;
      case 't':
        value += '\t';
        break;
      case 'u': {
        uint32_t code = 0;
        if (at + 4 >= json.size() ||
            !absl::SimpleHexAtoi(absl::string_view(json).substr(at + 1, 4), &code)) {
          return "";
        }
        AppendUtf8(code, value);
        at += 4;
        break;
      }
      default:
        value += e;  // ", \ and /
    }
  }
  return "";  // no closing quote
}

std::string ReasonOf(const grpc::Status& status) {
  return fuselink::ReasonOf(FromGrpcStatus(status));
}

}  // namespace fuselink::client
