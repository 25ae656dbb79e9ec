#include "tests/gpu/gpu_test_util.h"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace fuselink::gpu::testing {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

std::optional<std::string> WhyNoGpus(int gpus) {
  absl::StatusOr<const Driver*> driver = Driver::Load();
  if (!driver.ok()) return std::string(driver.status().message());
  absl::StatusOr<int> count = DeviceCount(**driver);
  if (!count.ok()) return std::string(count.status().message());
  if (*count < gpus) {
    return absl::StrCat("needs ", gpus, " GPUs, this machine has ", *count);
  }
  return std::nullopt;
}

void GpuTest::SetUp() {
  if (std::optional<std::string> why = WhyNoGpus(1)) GTEST_SKIP() << *why;
  driver_ = *Driver::Load();
  absl::StatusOr<PrimaryContext> context = PrimaryContext::Retain(*driver_, 0);
  ASSERT_TRUE(context.ok()) << context.status();
  context_.emplace(std::move(*context));
  absl::StatusOr<Stream> stream = Stream::Create(*context_);
  ASSERT_TRUE(stream.ok()) << stream.status();
  stream_.emplace(std::move(*stream));
}

void FillPattern(uint8_t* out, size_t size_bytes, uint64_t seed, uint64_t first_byte) {
  for (size_t i = 0; i < size_bytes; ++i) {
    const uint64_t position = first_byte + i;
    out[i] =
        static_cast<uint8_t>(SplitMix64(seed + position / 8) >> (8 * (position % 8)));
  }
}

std::vector<uint8_t> Pattern(size_t size_bytes, uint64_t seed, uint64_t first_byte) {
  std::vector<uint8_t> bytes(size_bytes);
  FillPattern(bytes.data(), size_bytes, seed, first_byte);
  return bytes;
}

uint64_t RandomSeed() {
  std::random_device device;
  return (uint64_t{device()} << 32) | device();
}

absl::StatusOr<std::vector<uint8_t>> ReadDevice(Stream& stream, cu::CUdeviceptr ptr,
                                                size_t size_bytes) {
  std::vector<uint8_t> bytes(size_bytes);
  FL_RETURN_IF_ERROR(stream.CopyDeviceToHost(bytes.data(), ptr, size_bytes));
  FL_RETURN_IF_ERROR(stream.Synchronize());
  return bytes;
}

absl::Status WriteDevice(Stream& stream, cu::CUdeviceptr ptr,
                         const std::vector<uint8_t>& bytes) {
  FL_RETURN_IF_ERROR(stream.CopyHostToDevice(ptr, bytes.data(), bytes.size()));
  return stream.Synchronize();
}

absl::Status SendMessage(int socket, const void* data, size_t size_bytes, int fd) {
  iovec iov{const_cast<void*>(data), size_bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* header = CMSG_FIRSTHDR(&msg);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
  }
  const ssize_t sent = sendmsg(socket, &msg, MSG_NOSIGNAL);
  if (sent < 0) return ErrnoStatus("sendmsg", errno);
  if (static_cast<size_t>(sent) != size_bytes) {
    return absl::DataLossError(absl::StrCat("sendmsg sent ", sent, " of ", size_bytes));
  }
  return absl::OkStatus();
}

absl::Status ReceiveMessage(int socket, void* data, size_t size_bytes, UniqueFd* fd) {
  iovec iov{data, size_bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t got = recvmsg(socket, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  if (got < 0) return ErrnoStatus("recvmsg", errno);
  if (static_cast<size_t>(got) != size_bytes) {
    return absl::DataLossError(absl::StrCat("recvmsg got ", got, " of ", size_bytes));
  }
  for (cmsghdr* header = CMSG_FIRSTHDR(&msg); header != nullptr;
       header = CMSG_NXTHDR(&msg, header)) {
    if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(header), sizeof(int));
      if (fd != nullptr) {
        fd->reset(received);
      } else {
        close(received);
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Child> Child::Start(const std::vector<std::string>& args) {
  char self[4096] = {};
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length < 0) return ErrnoStatus("readlink /proc/self/exe", errno);
  std::string helper(self, length);
  helper = helper.substr(0, helper.rfind('/') + 1) + "gpu_child";
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return ErrnoStatus("socketpair", errno);
  }
  UniqueFd parent_end(pair[0]);
  UniqueFd child_end(pair[1]);
  std::vector<std::string> argv_storage = {helper};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return ErrnoStatus("fork", errno);
  if (pid == 0) {
    // Only async-signal-safe calls until exec; dup2 clears close-on-exec.
    if (dup2(child_end.get(), kChildSocketFd) < 0) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return Child(pid, std::move(parent_end));
}

Child::Child(Child&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), socket_(std::move(other.socket_)) {}

Child::~Child() {
  socket_.reset();  // the child sees EOF and exits
  if (pid_ > 0) (void)Wait();
}

absl::StatusOr<int> Child::Wait() {
  int status = 0;
  if (pid_ <= 0) return absl::FailedPreconditionError("child already waited for");
  if (waitpid(std::exchange(pid_, -1), &status, 0) < 0)
    return ErrnoStatus("waitpid", errno);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

}  // namespace fuselink::gpu::testing
