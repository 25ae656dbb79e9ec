// Shared by the GPU tests and their child-process helper (gpu_child.cc).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/common/unique_fd.h"
#include "agent/gpu/device.h"
#include "agent/gpu/driver.h"
#include "agent/gpu/stream.h"
#include "gtest/gtest.h"

namespace fuselink::gpu::testing {

#define FL_ASSERT_OK(expr)                             \
  do {                                                 \
    const absl::Status _fl_t = (expr);                 \
    ASSERT_TRUE(_fl_t.ok()) << #expr << ": " << _fl_t; \
  } while (0)

// Why GPU tests cannot run here (no driver, no device, fewer than `gpus`), or nullopt.
std::optional<std::string> WhyNoGpus(int gpus);

// Base fixture: skips with the stated reason where there is no GPU; otherwise holds
// the driver, GPU 0's primary context and a stream on it.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override;
  const Driver* driver_ = nullptr;
  std::optional<PrimaryContext> context_;
  std::optional<Stream> stream_;
};

// Bytes that differ for each seed and position: byte i is byte i % 8 of
// splitmix64(seed + i / 8). `first_byte` is the position of out[0] in the sequence.
void FillPattern(uint8_t* out, size_t size_bytes, uint64_t seed, uint64_t first_byte = 0);
std::vector<uint8_t> Pattern(size_t size_bytes, uint64_t seed, uint64_t first_byte = 0);
// A fresh random seed.
uint64_t RandomSeed();

// Device memory copied to and from pageable host vectors, synchronously.
absl::StatusOr<std::vector<uint8_t>> ReadDevice(Stream& stream, cu::CUdeviceptr ptr,
                                                size_t size_bytes);
absl::Status WriteDevice(Stream& stream, cu::CUdeviceptr ptr,
                         const std::vector<uint8_t>& bytes);

// Message on a Unix stream socket, with at most one fd attached (SCM_RIGHTS).
absl::Status SendMessage(int socket, const void* data, size_t size_bytes, int fd = -1);
// Receives exactly `size_bytes`; `fd` gets the attached descriptor, if any.
absl::Status ReceiveMessage(int socket, void* data, size_t size_bytes,
                            UniqueFd* fd = nullptr);

// Child process running tests/gpu's helper binary (next to this test binary) with
// `args`, its end of a socket pair as fd 3. Waited for on destruction.
class Child {
 public:
  static absl::StatusOr<Child> Start(const std::vector<std::string>& args);
  Child(Child&& other) noexcept;
  ~Child();
  int socket() const { return socket_.get(); }
  // Waits for exit; the exit status (0 = success).
  absl::StatusOr<int> Wait();

 private:
  Child(pid_t pid, UniqueFd socket) : pid_(pid), socket_(std::move(socket)) {}
  pid_t pid_ = -1;
  UniqueFd socket_;
};

// fd number of the socket in the child.
inline constexpr int kChildSocketFd = 3;

}  // namespace fuselink::gpu::testing
