// socket_copy: one TCP stream over loopback between two processes, moving a 1 GiB
// buffer in 1 MiB sends into another 1 GiB buffer, pass after pass, as a fuselink
// transfer's bytes move on the TCP fabric (sendmsg from the tensor, recv into the
// target) but with no agent around them. Each buffer is a memfd mapped shared, as lent
// tensors are, written once before the first pass; in 4 KiB pages or with huge pages
// advised before that first touch (they are huge only where transparent_hugepage/
// shmem_enabled allows: advise, within_size or always). Prints each pass's GB/s, so a
// first pass over new memory shows apart from the later ones (docs/benchmarks.md,
// "Huge pages").
//
//   socket_copy [PASSES]   (4 by default)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr size_t kBuffer = size_t{1} << 30, kPiece = size_t{1} << 20;

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

char* NewBuffer(bool huge) {
  const int fd = memfd_create("socket_copy", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, kBuffer) != 0) Die("memfd");
  void* p = mmap(nullptr, kBuffer, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) Die("mmap");
  close(fd);
  if (huge) madvise(p, kBuffer, MADV_HUGEPAGE);
  std::memset(p, 1, kBuffer);
  return static_cast<char*>(p);
}

void Receive(int listener, int passes, bool huge) {
  char* to = NewBuffer(huge);
  const int s = accept(listener, nullptr, nullptr);
  if (s < 0) Die("accept");
  for (size_t i = 0; i < passes * (kBuffer / kPiece); ++i) {
    char* at = to + (i % (kBuffer / kPiece)) * kPiece;
    for (size_t got = 0; got < kPiece;) {
      const ssize_t n = recv(s, at + got, kPiece - got, MSG_WAITALL);
      if (n <= 0) Die("recv");
      got += static_cast<size_t>(n);
    }
  }
  const char done = 1;
  if (send(s, &done, 1, 0) != 1) Die("send");
}

// The GB/s of each pass of one sender, its receiver in a child process.
void Run(int passes, bool huge) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    Die("listen");
  }
  const pid_t child = fork();
  if (child < 0) Die("fork");
  if (child == 0) {
    Receive(listener, passes, huge);
    _exit(0);
  }
  close(listener);
  char* from = NewBuffer(huge);
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(s, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    Die("connect");
  }
  std::printf("%-11s", huge ? "huge pages" : "4 KiB pages");
  auto start = std::chrono::steady_clock::now();
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t i = 0; i < kBuffer / kPiece; ++i) {
      for (size_t sent = 0; sent < kPiece;) {
        const ssize_t n = send(s, from + i * kPiece + sent, kPiece - sent, MSG_NOSIGNAL);
        if (n <= 0) Die("send");
        sent += static_cast<size_t>(n);
      }
    }
    // The last pass is timed to the receiver's word that it has every byte; the others
    // as sent, which the socket buffers (a few MiB against 1 GiB) hardly shift.
    if (pass == passes - 1) {
      char done;
      if (recv(s, &done, 1, MSG_WAITALL) != 1) Die("recv");
    }
    const auto now = std::chrono::steady_clock::now();
    const std::chrono::duration<double> took = now - start;
    start = now;
    std::printf("  %6.2f", static_cast<double>(kBuffer) / took.count() / 1e9);
  }
  std::printf("\n");
  close(s);
  munmap(from, kBuffer);
  waitpid(child, nullptr, 0);
}

}  // namespace

int main(int argc, char** argv) {
  const int passes = argc > 1 ? std::atoi(argv[1]) : 4;
  if (passes < 1) {
    std::fprintf(stderr, "usage: socket_copy [PASSES >= 1]\n");
    return 2;
  }
  std::printf("pages      GB/s of each pass over 1 GiB, the first over new memory\n");
  for (const bool huge : {false, true}) Run(passes, huge);
  return 0;
}
