#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "agent/common/unique_fd.h"
#include "gtest/gtest.h"
#include "services/handle_socket/protocol.h"

namespace fuselink::services::handle_protocol {
namespace {

// Control data as the kernel lays it out: one SCM_RIGHTS entry per list.
std::vector<uint8_t> Control(const std::vector<std::vector<int>>& entries) {
  std::vector<uint8_t> out;
  for (const std::vector<int>& fds : entries) {
    const size_t at = out.size();
    out.resize(at + CMSG_SPACE(fds.size() * sizeof(int)));
    cmsghdr header{};
    header.cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    header.cmsg_level = SOL_SOCKET;
    header.cmsg_type = SCM_RIGHTS;
    std::memcpy(out.data() + at, &header, sizeof(header));
    if (!fds.empty()) {
      std::memcpy(out.data() + at + CMSG_LEN(0), fds.data(), fds.size() * sizeof(int));
    }
  }
  return out;
}

TEST(HandleProtocol, FindsWhatTheKernelPassed) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd a(pair[0]), b(pair[1]);
  UniqueFd to_send(dup(STDERR_FILENO));
  char op = kSendFd;
  iovec iov{&op, 1};
  alignas(cmsghdr) char out_control[CMSG_SPACE(sizeof(int))] = {};
  msghdr out{};
  out.msg_iov = &iov;
  out.msg_iovlen = 1;
  out.msg_control = out_control;
  out.msg_controllen = sizeof(out_control);
  cmsghdr* c = CMSG_FIRSTHDR(&out);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  const int sent_fd = to_send.get();
  std::memcpy(CMSG_DATA(c), &sent_fd, sizeof(int));
  ASSERT_EQ(sendmsg(a.get(), &out, 0), 1);

  char got_op = 0;
  iovec in_iov{&got_op, 1};
  alignas(cmsghdr) char in_control[CMSG_SPACE(sizeof(int))];
  msghdr in{};
  in.msg_iov = &in_iov;
  in.msg_iovlen = 1;
  in.msg_control = in_control;
  in.msg_controllen = sizeof(in_control);
  ASSERT_EQ(recvmsg(b.get(), &in, MSG_CMSG_CLOEXEC), 1);
  const std::vector<int> fds = PassedDescriptors(in_control, in.msg_controllen);
  ASSERT_EQ(fds.size(), 1u);
  UniqueFd received(fds[0]);
  EXPECT_NE(received.get(), sent_fd);  // a new descriptor of the same file
  absl::StatusOr<int> requested =
      RequestedDescriptor(absl::string_view(&got_op, 1), fds, in.msg_flags);
  ASSERT_TRUE(requested.ok()) << requested.status();
  EXPECT_EQ(*requested, received.get());
}

TEST(HandleProtocol, EveryDescriptorOfEveryEntry) {
  const std::vector<uint8_t> control = Control({{7}, {8, 9, 10}, {}});
  EXPECT_EQ(PassedDescriptors(control.data(), control.size()),
            (std::vector<int>{7, 8, 9, 10}));
  EXPECT_TRUE(PassedDescriptors(nullptr, 0).empty());
}

TEST(HandleProtocol, StopsAtAHeaderThatDoesNotFit) {
  std::vector<uint8_t> control = Control({{7}, {8}});
  // The second header claims more than there is: the walk keeps the first entry.
  cmsghdr second;
  const size_t at = CMSG_SPACE(sizeof(int));
  std::memcpy(&second, control.data() + at, sizeof(second));
  for (size_t len : {size_t{0}, size_t{3}, control.size(), ~size_t{0}}) {
    second.cmsg_len = len;
    std::memcpy(control.data() + at, &second, sizeof(second));
    EXPECT_EQ(PassedDescriptors(control.data(), control.size()), std::vector<int>{7})
        << len;
  }
  // Cut in the middle of the first header.
  EXPECT_TRUE(PassedDescriptors(control.data(), sizeof(cmsghdr) - 1).empty());
}

TEST(HandleProtocol, RefusesAnythingButOneDescriptorWithF) {
  EXPECT_TRUE(RequestedDescriptor("F", {5}, 0).ok());
  for (auto [data, fds, flags] :
       {std::tuple<std::string, std::vector<int>, int>{"F", {}, 0},
        {"F", {5, 6}, 0},
        {"G", {5}, 0},
        {"", {5}, 0},
        {"FF", {5}, 0},
        {"F", {5}, MSG_CTRUNC}}) {
    absl::StatusOr<int> requested = RequestedDescriptor(data, fds, flags);
    EXPECT_EQ(requested.status().code(), absl::StatusCode::kInvalidArgument)
        << data << " " << fds.size() << " " << flags;
  }
}

TEST(HandleProtocol, RepliesRoundTrip) {
  for (uint64_t token :
       {uint64_t{0}, uint64_t{1}, uint64_t{0x0123456789abcdef}, ~uint64_t{0}}) {
    absl::StatusOr<uint64_t> back = DecodeReply(EncodeReply(token));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, token);
  }
  const Reply refused = EncodeReply(absl::ResourceExhaustedError("full"));
  EXPECT_EQ(refused, (Reply{8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(DecodeReply(refused).status().code(), absl::StatusCode::kResourceExhausted);
  Reply unknown{};
  unknown[0] = 200;
  EXPECT_EQ(DecodeReply(unknown).status().code(), absl::StatusCode::kUnknown);
}

}  // namespace
}  // namespace fuselink::services::handle_protocol
