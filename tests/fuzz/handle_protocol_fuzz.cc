// The handle socket's protocol (services/handle_socket/protocol.h) on any bytes, as if
// recvmsg had returned them: the control data walk never reads outside it, a message
// is taken exactly when it is one 'F' with one descriptor and nothing cut, and a
// reply reads back as it was written. No descriptor is opened or closed.
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "services/handle_socket/protocol.h"
#include "tests/fuzz/fuzz_check.h"

namespace fuselink::services::handle_protocol {
namespace {

void CheckReply(const uint8_t* data) {
  Reply reply;
  std::memcpy(reply.data(), data, reply.size());
  uint32_t code;
  uint64_t token;
  std::memcpy(&code, data, sizeof(code));  // little-endian machines only, as CI
  std::memcpy(&token, data + 8, sizeof(token));
  const absl::StatusOr<uint64_t> decoded = DecodeReply(reply);
  FL_FUZZ_CHECK(decoded.ok() == (code == 0));
  if (decoded.ok()) {
    FL_FUZZ_CHECK(*decoded == token);
  } else {
    const uint32_t want =
        code <= 16 ? code : static_cast<uint32_t>(absl::StatusCode::kUnknown);
    FL_FUZZ_CHECK(static_cast<uint32_t>(decoded.status().code()) == want);
  }
  // What the agent writes for that outcome reads back the same.
  const absl::StatusOr<uint64_t> again = DecodeReply(EncodeReply(decoded));
  FL_FUZZ_CHECK(again.ok() == decoded.ok());
  if (again.ok()) FL_FUZZ_CHECK(*again == *decoded);
  if (!again.ok()) FL_FUZZ_CHECK(again.status().code() == decoded.status().code());
}

}  // namespace
}  // namespace fuselink::services::handle_protocol

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fuselink::services::handle_protocol;
  if (size >= kReplyBytes) CheckReply(data);
  if (size < 2) return 0;
  // Byte 0: how many data bytes recvmsg read (0 to 2); byte 1: whether the kernel
  // cut the control data; then the data; the rest is the control data, copied so
  // that it sits exactly at the end of its own allocation (ASan sees any overread).
  const size_t data_bytes = std::min<size_t>(data[0] % 3, size - 2);
  const int flags = (data[1] & 1) ? MSG_CTRUNC : 0;
  const absl::string_view message(reinterpret_cast<const char*>(data + 2), data_bytes);
  const std::vector<uint8_t> control(data + 2 + data_bytes, data + size);
  const std::vector<int> fds = PassedDescriptors(control.data(), control.size());
  FL_FUZZ_CHECK(fds.size() * sizeof(int) <= control.size());
  const absl::StatusOr<int> requested = RequestedDescriptor(message, fds, flags);
  FL_FUZZ_CHECK(requested.ok() ==
                (message == "F" && fds.size() == 1 && (flags & MSG_CTRUNC) == 0));
  if (requested.ok()) FL_FUZZ_CHECK(*requested == fds[0]);
  return 0;
}
