// Kubernetes discovery: the EndpointSlice -> peers reading, on slices as the API
// server writes them (discovery.k8s.io/v1, and v1beta1 of Kubernetes 1.20), with
// each addressType and dual stack; and the watch loop against a fake API server on
// 127.0.0.1 (plain HTTP, port 0) that ends watches at once, fails them or answers
// 410, to show every end is counted and followed by a doubling, jittered backoff.
#include "services/discovery/k8s_discovery.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace fuselink::services {
namespace {

constexpr char kV1[] = R"({
  "metadata": {"name": "fl-fuselink-abcde", "resourceVersion": "42"},
  "addressType": "IPv4",
  "endpoints": [
    {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "nodeName": "gpu-1"},
    {"addresses": ["10.0.0.2"], "conditions": {"ready": false}, "nodeName": "gpu-2"},
    {"addresses": ["10.0.0.3"], "nodeName": "gpu-3"}],
  "ports": [{"name": "metrics", "port": 17351, "protocol": "TCP"},
            {"name": "grpc", "port": 17350, "protocol": "TCP"}]})";

TEST(PeersOfSlice, V1NamesNodesAndTheGrpcPortAndSkipsSelf) {
  absl::StatusOr<SlicePeers> peers = PeersOfSlice(kV1, "grpc", "gpu-3");
  ASSERT_TRUE(peers.ok()) << peers.status();
  // Not-ready agents are peers too: they are starting, and connect on first use.
  EXPECT_EQ(peers->ipv4,
            (PeerSet{{"gpu-1", "10.0.0.1:17350"}, {"gpu-2", "10.0.0.2:17350"}}));
  EXPECT_TRUE(peers->ipv6.empty());
}

TEST(PeersOfSlice, V1beta1NamesNodesInTopology) {
  absl::StatusOr<SlicePeers> peers = PeersOfSlice(R"({
    "addressType": "IPv4",
    "endpoints": [{"addresses": ["127.0.81.1"],
                   "topology": {"kubernetes.io/hostname": "gpu-node-1"}}],
    "ports": [{"name": "grpc", "port": 17350}]})",
                                                  "grpc", "other");
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_EQ(peers->ipv4, (PeerSet{{"gpu-node-1", "127.0.81.1:17350"}}));
}

TEST(PeersOfSlice, Ipv6AddressesAreBracketed) {
  absl::StatusOr<SlicePeers> peers = PeersOfSlice(R"({
    "addressType": "IPv6",
    "endpoints": [{"addresses": ["fd00:10::1"], "nodeName": "gpu-1"},
                  {"addresses": ["::ffff:10.0.0.2"], "nodeName": "gpu-2"}],
    "ports": [{"name": "grpc", "port": 17350}]})",
                                                  "grpc", "");
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_EQ(peers->ipv6, (PeerSet{{"gpu-1", "[fd00:10::1]:17350"},
                                  {"gpu-2", "[::ffff:10.0.0.2]:17350"}}));
  EXPECT_TRUE(peers->ipv4.empty());
}

TEST(PeersOfSlice, AddressesNotOfTheSlicesTypeAreSkipped) {
  // An IPv4 slice holding an IPv6 address, or text that is no address at all: the
  // first address of the slice's family is taken, or none.
  absl::StatusOr<SlicePeers> v4 = PeersOfSlice(R"({
    "addressType": "IPv4",
    "endpoints": [{"addresses": ["fd00::1"], "nodeName": "a"},
                  {"addresses": ["not-an-ip", "fd00::2", "10.0.0.2"], "nodeName": "b"},
                  {"addresses": ["10.0.0.300"], "nodeName": "c"}],
    "ports": [{"name": "grpc", "port": 1}]})",
                                               "grpc", "");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->ipv4, (PeerSet{{"b", "10.0.0.2:1"}}));
  EXPECT_TRUE(v4->ipv6.empty());
  absl::StatusOr<SlicePeers> v6 = PeersOfSlice(R"({
    "addressType": "IPv6",
    "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "a"}],
    "ports": [{"name": "grpc", "port": 1}]})",
                                               "grpc", "");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(*v6, SlicePeers{});
}

TEST(PeersOfSlice, FqdnAndUnknownAddressTypesGiveNoPeers) {
  for (const char* type : {"FQDN", "IPv5", ""}) {
    absl::StatusOr<SlicePeers> peers =
        PeersOfSlice(absl::StrCat(R"({"addressType": ")", type, R"(",
          "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "a"},
                        {"addresses": ["agent-b.example"], "nodeName": "b"}],
          "ports": [{"name": "grpc", "port": 1}]})"),
                     "grpc", "");
    ASSERT_TRUE(peers.ok()) << peers.status();
    EXPECT_EQ(*peers, SlicePeers{}) << type;
  }
}

TEST(PeersOfSlice, WithoutAddressTypeEachAddressTakesItsOwnFamily) {
  absl::StatusOr<SlicePeers> peers = PeersOfSlice(R"({
    "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "a"},
                  {"addresses": ["fd00::2"], "nodeName": "b"}],
    "ports": [{"name": "grpc", "port": 7}]})",
                                                  "grpc", "");
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_EQ(peers->ipv4, (PeerSet{{"a", "10.0.0.1:7"}}));
  EXPECT_EQ(peers->ipv6, (PeerSet{{"b", "[fd00::2]:7"}}));
}

TEST(PeersOfSlice, NoPeerWithoutPortAddressOrNode) {
  EXPECT_EQ(*PeersOfSlice(R"({"endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "a"}],
                               "ports": [{"name": "metrics", "port": 1}]})",
                          "grpc", ""),
            SlicePeers{});
  EXPECT_EQ(*PeersOfSlice(R"({"endpoints": [{"addresses": [], "nodeName": "a"},
                                             {"addresses": ["10.0.0.2"]}],
                               "ports": [{"name": "grpc", "port": 17350}]})",
                          "grpc", ""),
            SlicePeers{});
  EXPECT_EQ(*PeersOfSlice(R"({"endpoints": null, "ports": null})", "grpc", ""),
            SlicePeers{});
  EXPECT_EQ(*PeersOfSlice(R"({"ports": [{"name": "grpc", "port": 70000}],
                               "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "a"}]})",
                          "grpc", ""),
            SlicePeers{});
}

TEST(PeersOfSlice, RefusesWhatIsNotJson) {
  EXPECT_EQ(PeersOfSlice("{not json", "grpc", "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A dual-stack Service: one slice per family naming the same nodes; "b" has only an
// IPv6 address, "c" only an IPv4 one. The IPv6 slice's name sorts first, as it did
// when whichever sorted first won.
const std::map<std::string, SlicePeers> kDualStack = {
    {"fl-aaaaa", {{}, {{"a", "[fd00::1]:1"}, {"b", "[fd00::2]:1"}}}},
    {"fl-zzzzz", {{{"a", "10.0.0.1:1"}, {"c", "10.0.0.3:1"}}, {}}},
};

TEST(MergePeers, DualStackTakesThePreferredFamilyElseTheOther) {
  EXPECT_EQ(MergePeers(kDualStack, AddressFamily::kIPv4),
            (PeerSet{{"a", "10.0.0.1:1"}, {"b", "[fd00::2]:1"}, {"c", "10.0.0.3:1"}}));
  EXPECT_EQ(MergePeers(kDualStack, AddressFamily::kIPv6),
            (PeerSet{{"a", "[fd00::1]:1"}, {"b", "[fd00::2]:1"}, {"c", "10.0.0.3:1"}}));
}

TEST(MergePeers, WithinAFamilyTheSliceThatSortsFirst) {
  // An agent briefly in two slices of one family (a slice being split): the same
  // answer every time, whatever order the events came in.
  const std::map<std::string, SlicePeers> two = {
      {"fl-1", {{{"a", "10.0.0.1:1"}}, {}}},
      {"fl-2", {{{"a", "10.0.0.9:1"}}, {}}},
  };
  EXPECT_EQ(MergePeers(two, AddressFamily::kIPv4), (PeerSet{{"a", "10.0.0.1:1"}}));
  EXPECT_EQ(MergePeers(two, AddressFamily::kIPv6), (PeerSet{{"a", "10.0.0.1:1"}}));
}

TEST(FamilyOfListen, Ipv6LiteralsOnly) {
  EXPECT_EQ(FamilyOfListen("10.0.0.1:17350"), AddressFamily::kIPv4);
  EXPECT_EQ(FamilyOfListen("0.0.0.0:17350"), AddressFamily::kIPv4);
  EXPECT_EQ(FamilyOfListen(":17350"), AddressFamily::kIPv4);
  EXPECT_EQ(FamilyOfListen("agent.example:17350"), AddressFamily::kIPv4);
  EXPECT_EQ(FamilyOfListen("[fd00::1]:17350"), AddressFamily::kIPv6);
  EXPECT_EQ(FamilyOfListen("[::]:17350"), AddressFamily::kIPv6);
  // $(POD_IP):port with an IPv6 pod address, unbracketed.
  EXPECT_EQ(FamilyOfListen("fd00::1:17350"), AddressFamily::kIPv6);
}

TEST(Jittered, StaysWithinHalfToWhole) {
  const absl::Duration b = absl::Milliseconds(800);
  EXPECT_EQ(Jittered(b, 0.0), absl::Milliseconds(400));
  EXPECT_EQ(Jittered(b, 1.0), b);
  EXPECT_EQ(Jittered(b, 0.5), absl::Milliseconds(600));
  EXPECT_EQ(Jittered(b, -3), absl::Milliseconds(400));
  EXPECT_EQ(Jittered(b, 7), b);
}

// A fake API server: one connection at a time (discovery makes one request at a
// time), each answered by `answer(path)` with the whole response, then closed.
class FakeApiServer {
 public:
  explicit FakeApiServer(std::function<std::string(const std::string&)> answer)
      : answer_(std::move(answer)) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 8), 0);
    socklen_t length = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &length);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeApiServer() {
    shutdown(fd_, SHUT_RDWR);  // wakes accept(2)
    thread_.join();
    close(fd_);
  }

  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }

  struct Seen {
    absl::Time at;
    std::string path;
  };
  // Waits (at most `bound`) until `n` requests came that `counted` counts; the
  // requests so far.
  std::vector<Seen> WaitFor(int n, bool (*counted)(const std::string&),
                            absl::Duration bound) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      int found = 0;
      for (const Seen& s : seen_) found += counted(s.path);
      return found >= n;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), bound);
    return seen_;
  }
  std::vector<Seen> WaitForWatches(int n, absl::Duration bound) {
    return WaitFor(n, IsWatch, bound);
  }

  static bool IsWatch(const std::string& path) {
    return absl::StrContains(path, "watch=1");
  }
  static bool IsList(const std::string& path) { return !IsWatch(path); }

 private:
  void Serve() {
    for (;;) {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string request;
      char chunk[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = recv(c, chunk, sizeof(chunk), 0);
        if (n <= 0) break;
        request.append(chunk, static_cast<size_t>(n));
      }
      const size_t start = request.find(' ') + 1;
      const std::string path = request.substr(start, request.find(' ', start) - start);
      {
        absl::MutexLock lock(&mu_);
        seen_.push_back({absl::Now(), path});
      }
      const std::string response = answer_(path);
      for (size_t sent = 0; sent < response.size();) {
        const ssize_t n =
            send(c, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
      close(c);
    }
  }

  const std::function<std::string(const std::string&)> answer_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<Seen> seen_ ABSL_GUARDED_BY(mu_);
};

// Whether `done` came true within kWaitBound, checked every millisecond: for state
// that has no condition variable to wait on (the discovery's counters).
bool WaitUntil(const std::function<bool()>& done) {
  for (const absl::Time end = absl::Now() + absl::Seconds(20); absl::Now() < end;) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return done();
}

std::string Ok(absl::string_view body) {
  return absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n",
                      "Connection: close\r\n\r\n", body);
}
std::string Status(int code) {
  return absl::StrCat("HTTP/1.1 ", code, " No\r\nContent-Length: 0\r\n",
                      "Connection: close\r\n\r\n");
}

constexpr char kList[] = R"({"metadata": {"resourceVersion": "42"}, "items": [
  {"metadata": {"name": "fl-aaaaa"}, "addressType": "IPv6",
   "endpoints": [{"addresses": ["fd00::1"], "nodeName": "a"}],
   "ports": [{"name": "grpc", "port": 17350}]},
  {"metadata": {"name": "fl-zzzzz"}, "addressType": "IPv4",
   "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": "a"}],
   "ports": [{"name": "grpc", "port": 17350}]}]})";

K8sDiscoveryOptions Options(const FakeApiServer& server) {
  K8sDiscoveryOptions options;
  options.api_server = server.url();
  options.token_file = "/dev/null";
  options.namespace_name = "ns";
  options.service = "fl";
  options.self = "self";
  options.backoff_min = absl::Milliseconds(20);
  options.backoff_max = absl::Milliseconds(160);
  return options;
}

// The watches' requests among `seen`.
std::vector<FakeApiServer::Seen> Watches(const std::vector<FakeApiServer::Seen>& seen) {
  std::vector<FakeApiServer::Seen> out;
  for (const auto& s : seen) {
    if (FakeApiServer::IsWatch(s.path)) out.push_back(s);
  }
  return out;
}

// Between the starts of watch k and k+1 there is at least the pause after watch k:
// half of min(backoff_min * 2^k, backoff_max).
void ExpectBackoffBetween(const std::vector<FakeApiServer::Seen>& watches,
                          const K8sDiscoveryOptions& options) {
  absl::Duration backoff = options.backoff_min;
  for (size_t k = 0; k + 1 < watches.size(); ++k) {
    const absl::Duration gap = watches[k + 1].at - watches[k].at;
    EXPECT_GE(gap, backoff / 2) << "between watch " << k << " and " << k + 1;
    std::printf("bench: watch %zu -> %zu after %s (backoff %s)\n", k, k + 1,
                absl::FormatDuration(gap).c_str(), absl::FormatDuration(backoff).c_str());
    backoff = std::min(backoff * 2, options.backoff_max);
  }
}

constexpr int kWatches = 7;  // past backoff_max (20 ms doubled 3 times)
constexpr absl::Duration kWaitBound = absl::Seconds(20);

TEST(K8sDiscovery, WatchesTheServerEndsAtOnceAreRenewedWithBackoff) {
  FakeApiServer server([](const std::string& path) {
    if (!FakeApiServer::IsWatch(path)) return Ok(kList);
    // Ended by the server at once, after a bookmark that moves the version.
    return Ok(R"({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "43"}}})"
              "\n");
  });
  const K8sDiscoveryOptions options = Options(server);
  std::vector<PeerSet> sets;
  absl::StatusOr<std::unique_ptr<K8sDiscovery>> d =
      K8sDiscovery::Start(options, [&](const PeerSet& p) { sets.push_back(p); });
  ASSERT_TRUE(d.ok()) << d.status();
  const auto watches = Watches(server.WaitForWatches(kWatches, kWaitBound));
  ASSERT_GE(watches.size(), static_cast<size_t>(kWatches));
  ExpectBackoffBetween(watches, options);
  EXPECT_TRUE(absl::StrContains(watches[0].path, "resourceVersion=42"));
  for (size_t k = 1; k < watches.size(); ++k) {
    EXPECT_TRUE(absl::StrContains(watches[k].path, "resourceVersion=43"))
        << watches[k].path;
  }
  EXPECT_GE((*d)->watch_ends(WatchEnd::kRenewed), static_cast<uint64_t>(kWatches - 1));
  EXPECT_EQ((*d)->watch_ends(WatchEnd::kError), 0u);
  EXPECT_EQ((*d)->watch_ends(WatchEnd::kGone), 0u);
  d->reset();
  // Dual stack, IPv4 preferred: the IPv4 address, though the IPv6 slice sorts first.
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_EQ(sets[0], (PeerSet{{"a", "10.0.0.1:17350"}}));
}

TEST(K8sDiscovery, FailedAndGoneWatchesRelistWithBackoffAndAreCounted) {
  std::atomic<int> watch_number{0};
  FakeApiServer server([&](const std::string& path) {
    if (!FakeApiServer::IsWatch(path)) return Ok(kList);
    return watch_number++ % 2 == 0 ? Status(500) : Status(410);
  });
  K8sDiscoveryOptions options = Options(server);
  options.prefer = AddressFamily::kIPv6;
  std::vector<PeerSet> sets;
  absl::StatusOr<std::unique_ptr<K8sDiscovery>> d =
      K8sDiscovery::Start(options, [&](const PeerSet& p) { sets.push_back(p); });
  ASSERT_TRUE(d.ok()) << d.status();
  const auto seen = server.WaitForWatches(kWatches, kWaitBound);
  const auto watches = Watches(seen);
  ASSERT_GE(watches.size(), static_cast<size_t>(kWatches));
  ExpectBackoffBetween(watches, options);
  // Each failed watch is followed by a list before the next watch.
  EXPECT_GE(seen.size() - watches.size(), watches.size());
  EXPECT_GE((*d)->watch_ends(WatchEnd::kError), static_cast<uint64_t>(kWatches / 2));
  EXPECT_GE((*d)->watch_ends(WatchEnd::kGone), static_cast<uint64_t>(kWatches / 2 - 1));
  EXPECT_EQ((*d)->watch_ends(WatchEnd::kRenewed), 0u);
  d->reset();
  // The same list each time: published once, the IPv6 address in brackets.
  ASSERT_EQ(sets.size(), 1u);
  EXPECT_EQ(sets[0], (PeerSet{{"a", "[fd00::1]:17350"}}));
}

TEST(K8sDiscovery, FailedListsAreRetriedWithBackoffAndCounted) {
  std::atomic<int> lists{0};
  FakeApiServer server([&](const std::string& path) {
    if (FakeApiServer::IsWatch(path)) return Status(500);
    return lists++ == 0 ? Ok(kList) : Status(503);  // only the first list works
  });
  const K8sDiscoveryOptions options = Options(server);
  absl::StatusOr<std::unique_ptr<K8sDiscovery>> d =
      K8sDiscovery::Start(options, [](const PeerSet&) {});
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<absl::Time> at;
  for (const auto& s : server.WaitFor(5, FakeApiServer::IsList, kWaitBound)) {
    if (FakeApiServer::IsList(s.path)) at.push_back(s.at);
  }
  ASSERT_GE(at.size(), 5u);
  // The list after the failed watch follows the watch's pause; each failed list
  // doubles it.
  absl::Duration backoff = options.backoff_min * 2;
  for (size_t k = 2; k < at.size(); ++k) {
    EXPECT_GE(at[k] - at[k - 1], backoff / 2) << "between lists " << k - 1 << ", " << k;
    backoff = std::min(backoff * 2, options.backoff_max);
  }
  EXPECT_GE((*d)->failed_lists(), at.size() - 2);
  EXPECT_EQ((*d)->watch_ends(WatchEnd::kError), 1u);
}

TEST(K8sDiscovery, StopsDuringALongBackoff) {
  FakeApiServer server([](const std::string& path) {
    return FakeApiServer::IsWatch(path) ? Status(500) : Ok(kList);
  });
  K8sDiscoveryOptions options = Options(server);
  options.backoff_min = absl::Minutes(10);
  options.backoff_max = absl::Minutes(10);
  absl::StatusOr<std::unique_ptr<K8sDiscovery>> d =
      K8sDiscovery::Start(options, [](const PeerSet&) {});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(Watches(server.WaitForWatches(1, kWaitBound)).size(), 1u);
  // The watch's end is counted just before its pause begins.
  ASSERT_TRUE(WaitUntil([&] { return (*d)->watch_ends(WatchEnd::kError) > 0; }));
  ASSERT_EQ((*d)->watch_ends(WatchEnd::kError), 1u);
  const absl::Time start = absl::Now();
  d->reset();
  EXPECT_LT(absl::Now() - start, absl::Minutes(1)) << "the 5-10 minute pause held it";
}

TEST(K8sDiscovery, RefusesABackoffThatCannotBeBounded) {
  FakeApiServer server([](const std::string&) { return Ok(kList); });
  K8sDiscoveryOptions options = Options(server);
  options.backoff_min = absl::ZeroDuration();
  EXPECT_EQ(K8sDiscovery::Start(options, [](const PeerSet&) {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.backoff_min = absl::Seconds(2);
  options.backoff_max = absl::Seconds(1);
  EXPECT_EQ(K8sDiscovery::Start(options, [](const PeerSet&) {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fuselink::services
