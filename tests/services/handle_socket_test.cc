// The handle socket on real Unix sockets in a private temporary directory: many
// clients at once, per-client time limits, refusals counted, stray descriptors
// closed, the peer's kernel credentials kept with the token, the runtime directory
// checks, and tokens that cannot be guessed from one another.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "gtest/gtest.h"
#include "services/handle_socket/socket.h"
#include "tests/common/fd_passing.h"

namespace fuselink::services {
namespace {

// Far past every limit the socket sets itself; only a hang reaches it.
constexpr absl::Duration kGenerous = absl::Seconds(3);

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/fuselink-handle-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;  // mkdtemp makes it 0700
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

UniqueFd Connect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return UniqueFd();
  }
  return fd;
}

// Whether the agent closed `fd` within `wait` (EOF or reset, after any reply).
bool ClosedWithin(int fd, absl::Duration wait) {
  const absl::Time until = absl::Now() + wait;
  while (absl::Now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) > 0) {
      char byte;
      const ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
    }
  }
  return false;
}

bool StillOpen(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 0;
}

using fuselink::testing::SendWithFds;

absl::StatusOr<uint64_t> ReadReply(int socket_fd) {
  handle_protocol::Reply reply{};
  if (recv(socket_fd, reply.data(), reply.size(), MSG_WAITALL) !=
      static_cast<ssize_t>(reply.size())) {
    return absl::UnavailableError("no reply");
  }
  return handle_protocol::DecodeReply(reply);
}

UniqueFd Memfd() { return UniqueFd(memfd_create("handle-test", MFD_CLOEXEC)); }

class HandleSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.path() + "/node.sock";
    absl::StatusOr<std::unique_ptr<HandleSocket>> s =
        HandleSocket::Listen(path_, &tokens_);
    ASSERT_TRUE(s.ok()) << s.status();
    socket_ = *std::move(s);
  }

  TempDir dir_;
  std::string path_;
  memory::FdTokens tokens_;
  std::unique_ptr<HandleSocket> socket_;
};

TEST_F(HandleSocketTest, TheSocketFileIs0600) {
  struct stat st {};
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(HandleSocketTest, ASilentClientDoesNotDelayAnother) {
  UniqueFd silent = Connect(path_);
  ASSERT_TRUE(silent.valid());
  // A client trickling bytes without descriptors, too.
  UniqueFd trickle = Connect(path_);
  ASSERT_TRUE(trickle.valid());
  ASSERT_EQ(SendWithFds(trickle.get(), "x", {}), 1);
  const absl::Time start = absl::Now();
  UniqueFd memfd = Memfd();
  absl::StatusOr<uint64_t> token = SendFd(path_, memfd.get());
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_LT(absl::Now() - start, kGenerous);
  EXPECT_TRUE(StillOpen(silent.get()));  // served beside it, not after it
  EXPECT_TRUE(tokens_.Take(*token).ok());
}

TEST_F(HandleSocketTest, ASilentClientIsCutOffAndCounted) {
  UniqueFd silent = Connect(path_);
  ASSERT_TRUE(silent.valid());
  const absl::Time start = absl::Now();
  ASSERT_TRUE(ClosedWithin(silent.get(), kHandleIdleTimeout + kGenerous));
  EXPECT_GE(absl::Now() - start, kHandleIdleTimeout - absl::Milliseconds(100));
  EXPECT_EQ(socket_->stats().timed_out, 1u);
  EXPECT_EQ(socket_->stats().connections, 1u);
}

TEST_F(HandleSocketTest, AClientRefusedTooOftenIsClosed) {
  // Each bad message is answered; the kMaxHandleRefusals-th answer is the last.
  UniqueFd client = Connect(path_);
  ASSERT_TRUE(client.valid());
  for (int i = 0; i < kMaxHandleRefusals + 1; ++i) SendWithFds(client.get(), "x", {});
  ASSERT_TRUE(ClosedWithin(client.get(), kGenerous));
  EXPECT_EQ(socket_->stats().bad_messages, static_cast<uint64_t>(kMaxHandleRefusals));
}

TEST_F(HandleSocketTest, TooManyClientsAreRefusedAndCounted) {
  std::vector<UniqueFd> held;
  for (size_t i = 0; i < kMaxHandleClients; ++i) {
    held.push_back(Connect(path_));
    ASSERT_TRUE(held.back().valid());
  }
  const absl::Time until = absl::Now() + kGenerous;
  while (socket_->stats().connections < kMaxHandleClients && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(socket_->stats().connections, kMaxHandleClients);
  UniqueFd one_more = Connect(path_);
  ASSERT_TRUE(one_more.valid());  // the kernel queues it; the agent refuses it
  const absl::StatusOr<uint64_t> reply = ReadReply(one_more.get());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(ClosedWithin(one_more.get(), kGenerous));
  EXPECT_EQ(socket_->stats().refused_too_many_clients, 1u);
  // Slots come back as clients leave.
  held.clear();
  const absl::Time again_until = absl::Now() + kGenerous;
  absl::StatusOr<uint64_t> token = absl::UnavailableError("not tried");
  UniqueFd memfd = Memfd();
  while (!token.ok() && absl::Now() < again_until) token = SendFd(path_, memfd.get());
  EXPECT_TRUE(token.ok()) << token.status();
}

// Whether every copy of `read_end`'s pipe is closed but the caller's: the write end
// then polls POLLERR.
bool ReadersGone(int write_end) {
  pollfd p{write_end, POLLOUT, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLERR) != 0;
}

TEST_F(HandleSocketTest, StrayDescriptorsAreClosed) {
  UniqueFd client = Connect(path_);
  ASSERT_TRUE(client.valid());
  struct Case {
    std::string data;
    int copies;
  };
  for (const Case& c : {Case{"F", 2}, Case{"G", 1}, Case{"F", kMaxHandleFdsSeen + 3}}) {
    int pipe_fds[2];
    ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
    UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
    std::vector<int> fds(c.copies, read_end.get());
    ASSERT_EQ(SendWithFds(client.get(), c.data, fds), 1);
    read_end.reset();  // only the agent's copies are left
    EXPECT_EQ(ReadReply(client.get()).status().code(), absl::StatusCode::kInvalidArgument)
        << c.data << " " << c.copies;
    EXPECT_TRUE(ReadersGone(write_end.get())) << c.data << " " << c.copies;
  }
  EXPECT_EQ(socket_->stats().bad_messages, 3u);
  EXPECT_EQ(socket_->stats().descriptors_taken, 0u);
  // The connection still takes a good message.
  UniqueFd memfd = Memfd();
  ASSERT_EQ(SendWithFds(client.get(), "F", {memfd.get()}), 1);
  EXPECT_TRUE(ReadReply(client.get()).ok());
}

TEST_F(HandleSocketTest, TheTokenRemembersThePeersKernelCredentials) {
  UniqueFd memfd = Memfd();
  absl::StatusOr<uint64_t> token = SendFd(path_, memfd.get());
  ASSERT_TRUE(token.ok()) << token.status();
  absl::StatusOr<memory::LentFd> lent = tokens_.Take(*token);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_TRUE(lent->lender.known);
  EXPECT_EQ(lent->lender.pid, getpid());
  EXPECT_EQ(lent->lender.uid, getuid());
  EXPECT_EQ(lent->lender.gid, getgid());
  EXPECT_EQ(socket_->stats().descriptors_taken, 1u);
}

TEST_F(HandleSocketTest, TokensAreDistinctAndNotSequential) {
  constexpr int kTokens = 32;
  std::vector<uint64_t> tokens;
  UniqueFd memfd = Memfd();
  for (int i = 0; i < kTokens; ++i) {
    absl::StatusOr<uint64_t> token = SendFd(path_, memfd.get());
    ASSERT_TRUE(token.ok()) << token.status();
    tokens.push_back(*token);
  }
  absl::flat_hash_set<uint64_t> distinct(tokens.begin(), tokens.end());
  EXPECT_EQ(distinct.size(), tokens.size());
  int small_steps = 0, high_words = 0;
  for (int i = 0; i < kTokens; ++i) {
    if (i > 0 && tokens[i] - tokens[i - 1] < (uint64_t{1} << 32)) ++small_steps;
    if ((tokens[i] >> 32) != 0) ++high_words;
  }
  EXPECT_EQ(small_steps, 0);           // chance per step 2^-32
  EXPECT_GE(high_words, kTokens - 1);  // all 64 bits are used
}

TEST(RuntimeDir, IsCreated0700WhenAbsent) {
  TempDir base;
  const std::string dir = base.path() + "/run";
  ASSERT_TRUE(PrepareRuntimeDir(dir).ok());
  struct stat st {};
  ASSERT_EQ(lstat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_TRUE(PrepareRuntimeDir(dir).ok());  // and then accepted as it is
}

TEST(RuntimeDir, RefusesWhatIsNotPrivate) {
  TempDir base;
  auto refused = [](const std::string& dir) {
    const absl::Status s = PrepareRuntimeDir(dir);
    return s.code() == absl::StatusCode::kFailedPrecondition &&
           ReasonOf(s) == "RUNTIME_DIR_UNSAFE";
  };
  const std::string open_dir = base.path() + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0755), 0);
  EXPECT_TRUE(refused(open_dir));
  struct stat st {};
  ASSERT_EQ(lstat(open_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);  // left as it was

  const std::string file = base.path() + "/file";
  std::ofstream(file) << "x";
  EXPECT_TRUE(refused(file));

  const std::string link = base.path() + "/link";
  const std::string private_dir = base.path() + "/private";
  ASSERT_EQ(mkdir(private_dir.c_str(), 0700), 0);
  ASSERT_EQ(symlink(private_dir.c_str(), link.c_str()), 0);
  EXPECT_TRUE(refused(link));

  if (geteuid() == 0) {  // only root can give a directory away
    const std::string theirs = base.path() + "/theirs";
    ASSERT_EQ(mkdir(theirs.c_str(), 0700), 0);
    ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
    EXPECT_TRUE(refused(theirs));
  }

  // Listen applies the same checks to the socket's directory.
  memory::FdTokens tokens;
  const absl::StatusOr<std::unique_ptr<HandleSocket>> s =
      HandleSocket::Listen(open_dir + "/node.sock", &tokens);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  // ... and does not replace what is not a socket.
  const std::string not_socket = private_dir + "/node.sock";
  std::ofstream(not_socket) << "x";
  EXPECT_EQ(HandleSocket::Listen(not_socket, &tokens).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(RuntimeDir, DefaultSocketPathIsOneComponent) {
  absl::StatusOr<std::string> path = DefaultSocketPath("/run/fuselink", "node-a");
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, "/run/fuselink/node-a.sock");
  for (const char* bad : {"", ".", "..", "a/b", "../x"}) {
    EXPECT_EQ(DefaultSocketPath("/run/fuselink", bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace fuselink::services
