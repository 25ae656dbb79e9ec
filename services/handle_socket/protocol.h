// The handle socket's protocol as bytes (handle_socket.h has the socket). Pure: no
// sockets, no descriptors opened or closed, so that it can be tested and fuzzed
// alone.
//
// Per message, the client sends one byte, kSendFd, with one descriptor attached
// (SCM_RIGHTS); the agent answers kReplyBytes: u32 code (absl::StatusCode, 0 = OK),
// u32 reserved (0), u64 token, little-endian.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fuselink::services::handle_protocol {

inline constexpr char kSendFd = 'F';
inline constexpr size_t kReplyBytes = 16;
using Reply = std::array<uint8_t, kReplyBytes>;

// Every descriptor that the control data of a received message carries, in order:
// SCM_RIGHTS entries of any count (the kernel installed all of them in this
// process, so the caller must close every one it does not keep). `control` and
// `control_bytes` are msghdr's msg_control and msg_controllen as recvmsg left them;
// any bytes are safe, a header that does not fit ends the walk.
std::vector<int> PassedDescriptors(const void* control, size_t control_bytes);

// The descriptor one message hands over: `data` (what recvmsg read) is exactly
// kSendFd, `descriptors` holds exactly one, and `msg_flags` says that nothing was
// cut (MSG_CTRUNC). INVALID_ARGUMENT otherwise.
absl::StatusOr<int> RequestedDescriptor(absl::string_view data,
                                        const std::vector<int>& descriptors,
                                        int msg_flags);

// The agent's answer: the token, or the status's code with token 0.
Reply EncodeReply(const absl::StatusOr<uint64_t>& token);
// The client's reading of it. A code that is not an absl::StatusCode is UNKNOWN;
// the reserved word is ignored, so that a later version may use it.
absl::StatusOr<uint64_t> DecodeReply(const Reply& reply);

}  // namespace fuselink::services::handle_protocol
