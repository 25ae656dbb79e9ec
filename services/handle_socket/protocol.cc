#include "services/handle_socket/protocol.h"

#include <sys/socket.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace fuselink::services::handle_protocol {
namespace {

constexpr size_t kCodeAt = 0;
constexpr size_t kTokenAt = 8;
// The largest absl::StatusCode.
constexpr uint32_t kMaxCode = static_cast<uint32_t>(absl::StatusCode::kUnauthenticated);

}  // namespace

std::vector<int> PassedDescriptors(const void* control, size_t control_bytes) {
  // Walked by offset, as CMSG_FIRSTHDR and CMSG_NXTHDR do, but every bound checked
  // before any pointer moves: their arithmetic overflows on a hostile cmsg_len.
  const auto* bytes = static_cast<const uint8_t*>(control);
  std::vector<int> out;
  size_t at = 0;
  while (control_bytes - at >= sizeof(cmsghdr)) {
    cmsghdr header;
    std::memcpy(&header, bytes + at, sizeof(header));
    if (header.cmsg_len < CMSG_LEN(0) || header.cmsg_len > control_bytes - at) break;
    if (header.cmsg_level == SOL_SOCKET && header.cmsg_type == SCM_RIGHTS) {
      for (size_t fd_at = CMSG_LEN(0); fd_at + sizeof(int) <= header.cmsg_len;
           fd_at += sizeof(int)) {
        int fd;
        std::memcpy(&fd, bytes + at + fd_at, sizeof(int));
        out.push_back(fd);
      }
    }
    const size_t next = CMSG_ALIGN(header.cmsg_len);
    if (next > control_bytes - at) break;
    at += next;
  }
  return out;
}

absl::StatusOr<int> RequestedDescriptor(absl::string_view data,
                                        const std::vector<int>& descriptors,
                                        int msg_flags) {
  if (data != absl::string_view(&kSendFd, 1) || descriptors.size() != 1 ||
      (msg_flags & MSG_CTRUNC) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected one descriptor with 'F', got ", data.size(), " bytes and ",
        descriptors.size(), " descriptors", (msg_flags & MSG_CTRUNC) ? ", cut" : ""));
  }
  return descriptors[0];
}

Reply EncodeReply(const absl::StatusOr<uint64_t>& token) {
  Reply out{};
  const auto code = static_cast<uint32_t>(token.status().code());
  const uint64_t value = token.ok() ? *token : 0;
  for (size_t i = 0; i < 4; ++i) out[kCodeAt + i] = static_cast<uint8_t>(code >> (8 * i));
  for (size_t i = 0; i < 8; ++i) {
    out[kTokenAt + i] = static_cast<uint8_t>(value >> (8 * i));
  }
  return out;
}

absl::StatusOr<uint64_t> DecodeReply(const Reply& reply) {
  uint32_t code = 0;
  for (size_t i = 0; i < 4; ++i)
    code |= static_cast<uint32_t>(reply[kCodeAt + i]) << (8 * i);
  uint64_t token = 0;
  for (size_t i = 0; i < 8; ++i) {
    token |= static_cast<uint64_t>(reply[kTokenAt + i]) << (8 * i);
  }
  if (code == 0) return token;
  const absl::StatusCode status_code =
      code <= kMaxCode ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
  return absl::Status(status_code,
                      absl::StrCat("the agent refused the descriptor (code ", code, ")"));
}

}  // namespace fuselink::services::handle_protocol
