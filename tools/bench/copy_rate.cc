// copy_rate: what one core's memcpy moves, with the source and the target each in
// DRAM (a 1 GiB buffer, touched before) or in the caches (a 1 MiB buffer used again
// and again). A loopback TCP byte is copied twice, into the socket and out of it:
// iperf3 -l 1M copies cache to cache both times, a fuselink transfer DRAM to cache
// and cache to DRAM (docs/benchmarks.md, "Loopback"). Then, beside socket_copy, the
// same DRAM-to-DRAM copy over buffers just made, first pass and second, in 4 KiB pages
// and in huge pages (MADV_HUGEPAGE; where transparent_hugepage/enabled is never, both
// rows are 4 KiB): whether new memory or small pages cost a plain copy anything
// (docs/benchmarks.md, "Huge pages").
//
//   copy_rate [ROUNDS]   prints GB/s (1e9 B/s) for each pairing, each round
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr size_t kBig = size_t{1} << 30, kSmall = size_t{1} << 20;

// 1 GiB, every byte written once; `huge`: advised huge pages before the first touch.
char* Dram(bool huge = false) {
  void* p =
      mmap(nullptr, kBig, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  if (huge) madvise(p, kBig, MADV_HUGEPAGE);
  std::memset(p, 1, kBig);
  return static_cast<char*>(p);
}

// GB/s of 1 GiB copied in 1 MiB pieces; a buffer with `stride` 0 is the same MiB.
double Rate(char* to, size_t to_stride, const char* from, size_t from_stride) {
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < kBig / kSmall; ++i) {
    std::memcpy(to + i * to_stride, from + i * from_stride, kSmall);
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return static_cast<double>(kBig) / took.count() / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  char* a = Dram();
  char* b = Dram();
  std::vector<char> s(kSmall, 3), d(kSmall, 4);
  std::printf("round  dram->dram  dram->cache  cache->dram  cache->cache   (GB/s)\n");
  for (int r = 0; r < rounds; ++r) {
    const double dd = Rate(b, kSmall, a, kSmall);
    const double dc = Rate(d.data(), 0, a, kSmall);
    const double cd = Rate(b, kSmall, s.data(), 0);
    const double cc = Rate(d.data(), 0, s.data(), 0);
    std::printf("%5d  %10.2f  %11.2f  %11.2f  %12.2f\n", r + 1, dd, dc, cd, cc);
  }
  munmap(a, kBig);
  munmap(b, kBig);
  std::printf("\nnew memory, dram->dram  first pass  second pass   (GB/s)\n");
  for (int r = 0; r < rounds; ++r) {
    for (const bool huge : {false, true}) {
      char* from = Dram(huge);
      char* to = Dram(huge);
      const double first = Rate(to, kSmall, from, kSmall);
      const double second = Rate(to, kSmall, from, kSmall);
      std::printf("%5d  %-13s  %10.2f  %11.2f\n", r + 1,
                  huge ? "huge pages" : "4 KiB pages", first, second);
      munmap(from, kBig);
      munmap(to, kBig);
    }
  }
  return 0;
}
