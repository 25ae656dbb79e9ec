// The /metrics HTTP server (services/metrics/http/metrics_server.h) on real sockets on
// 127.0.0.1, port 0: a flood of idle and half-sent connections does not hold a
// scrape; each refusal answers its status and is counted; basic auth; TLS with a
// throwaway CA made by the openssl binary, with and without client certificates,
// and a certificate rotated under a running server.
#include "services/metrics/http/metrics_server.h"

#include <arpa/inet.h>
#include <crypt.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/metrics/http/http_request.h"

namespace fuselink::services::http {
namespace {

constexpr char kBody[] = "# TYPE fuselink_test gauge\nfuselink_test 1\n";

// Refusals counted by the server, read by the test thread.
struct Counts {
  std::array<std::atomic<int>, kRefusalKinds> by_reason{};
  int operator[](Refusal r) const { return by_reason[static_cast<int>(r)].load(); }
};

std::unique_ptr<MetricsServer> Serve(Counts* counts, WebConfig web = {},
                                     int max_connections = kDefaultMaxConnections,
                                     absl::Duration request_timeout = absl::Seconds(5)) {
  MetricsServerOptions options;
  options.listen = "127.0.0.1:0";
  options.web_config = std::move(web);
  options.max_connections = max_connections;
  options.request_timeout = request_timeout;
  options.render = [] { return std::string(kBody); };
  options.on_refusal = [counts](Refusal r) { ++counts->by_reason[static_cast<int>(r)]; };
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// A blocking TCP connection with a 10 s receive timeout.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void SendAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

// One response read from `fd`: its head and exactly Content-Length body bytes.
// One response from `fd`. Bytes of the next (pipelined) response that arrived with it
// are kept for the next call on the same descriptor.
std::string ReadResponse(int fd) {
  static thread_local std::map<int, std::string> leftovers;  // threads: guessers
  std::string got = std::move(leftovers[fd]);
  leftovers.erase(fd);
  char chunk[4096];
  for (;;) {
    const size_t head_end = got.find("\r\n\r\n");
    if (head_end != std::string::npos) {
      const size_t at = got.find("Content-Length: ");
      if (at != std::string::npos && at < head_end) {
        const size_t length = std::strtoul(got.c_str() + at + 16, nullptr, 10);
        if (got.size() >= head_end + 4 + length) {
          if (got.size() > head_end + 4 + length) {
            leftovers[fd] = got.substr(head_end + 4 + length);
          }
          return got.substr(0, head_end + 4 + length);
        }
      }
    }
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return got;
    got.append(chunk, static_cast<size_t>(n));
  }
}

std::string Request(int port, absl::string_view request) {
  const int fd = Connect(port);
  SendAll(fd, request);
  std::string response = ReadResponse(fd);
  close(fd);
  return response;
}

std::string Get(absl::string_view path, absl::string_view headers = "") {
  return absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n", headers, "\r\n");
}

TEST(MetricsServer, ServesMetrics) {
  Counts counts;
  auto server = Serve(&counts);
  const std::string response = Request(server->port(), Get("/metrics"));
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 200 OK\r\n")) << response;
  EXPECT_TRUE(absl::EndsWith(response, kBody)) << response;
  EXPECT_TRUE(absl::StrContains(response, "Content-Type: text/plain; version=0.0.4"));
}

TEST(MetricsServer, HundredIdleAndHalfSentConnectionsDoNotHoldAScrape) {
  Counts counts;
  auto server = Serve(&counts);
  std::vector<int> stuck;
  for (int i = 0; i < 100; ++i) {
    stuck.push_back(Connect(server->port()));
    if (i % 2 == 1)
      SendAll(stuck.back(), i % 4 == 1 ? "GET /metr" : "GET /metrics HTTP/1.1\r\nHo");
  }
  const absl::Time start = absl::Now();
  const std::string response = Request(server->port(), Get("/metrics"));
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 200 OK\r\n")) << response;
  EXPECT_TRUE(absl::EndsWith(response, kBody));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // Past the bound, the longest-waiting ones made room.
  EXPECT_GE(counts[Refusal::kTooManyConnections], 100 + 1 - kDefaultMaxConnections);
  for (int fd : stuck) close(fd);
}

TEST(MetricsServer, BoundedConnectionsCloseTheOldestIdleOne) {
  Counts counts;
  auto server = Serve(&counts, {}, /*max_connections=*/2);
  const int first = Connect(server->port());
  const int second = Connect(server->port());
  absl::SleepFor(absl::Milliseconds(50));
  const std::string response = Request(server->port(), Get("/metrics"));
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 200 OK\r\n")) << response;
  char byte;
  EXPECT_EQ(recv(first, &byte, 1, 0), 0) << "the oldest connection should be closed";
  EXPECT_EQ(counts[Refusal::kTooManyConnections], 1);
  close(first);
  close(second);
}

TEST(MetricsServer, HalfSentRequestTimesOut) {
  Counts counts;
  auto server = Serve(&counts, {}, kDefaultMaxConnections, absl::Milliseconds(200));
  const int fd = Connect(server->port());
  SendAll(fd, "GET /metrics HTTP/1.1\r\n");
  const absl::Time start = absl::Now();
  char byte;
  EXPECT_EQ(recv(fd, &byte, 1, 0), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(counts[Refusal::kTimeout], 1);
  close(fd);
}

TEST(MetricsServer, OversizedHeadIs431) {
  Counts counts;
  auto server = Serve(&counts);
  const std::string response = Request(
      server->port(),
      Get("/metrics",
          absl::StrCat("X-Big: ", std::string(kMaxRequestHeadBytes, 'a'), "\r\n")));
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 431 ")) << response;
  EXPECT_EQ(counts[Refusal::kOversize], 1);
}

TEST(MetricsServer, RefusalsAnswerTheirStatus) {
  Counts counts;
  auto server = Serve(&counts);
  EXPECT_TRUE(absl::StartsWith(Request(server->port(), Get("/")), "HTTP/1.1 404 "));
  EXPECT_TRUE(
      absl::StartsWith(Request(server->port(), Get("/metricsx")), "HTTP/1.1 404 "));
  const std::string post =
      Request(server->port(), "POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(post, "HTTP/1.1 405 ")) << post;
  EXPECT_TRUE(absl::StrContains(post, "Allow: GET, HEAD\r\n"));
  EXPECT_TRUE(
      absl::StartsWith(Request(server->port(), "NONSENSE\r\n\r\n"), "HTTP/1.1 400 "));
  EXPECT_TRUE(absl::StartsWith(Request(server->port(), "GET /metrics HTTP/2.0\r\n\r\n"),
                               "HTTP/1.1 400 "));
  EXPECT_TRUE(absl::StartsWith(
      Request(server->port(), "GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"),
      "HTTP/1.1 400 "));
  EXPECT_EQ(counts[Refusal::kMalformed], 6);
  const std::string head = Request(server->port(), "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(head, "HTTP/1.1 200 ")) << head;
  EXPECT_TRUE(absl::EndsWith(head, "\r\n\r\n")) << "HEAD has no body";
}

// Thousands of requests pipelined on one connection are answered one by one, as the
// client reads them: the server never serves a connection's next request from inside
// the last one (no recursion to overflow its stack), and serves the others meanwhile.
TEST(MetricsServer, ThousandsOfPipelinedRequestsAreAnsweredInTurn) {
  Counts counts;
  auto server = Serve(&counts);
  constexpr int kRequests = 5000;
  const int fd = Connect(server->port());
  std::string all;
  for (int i = 0; i < kRequests; ++i) absl::StrAppend(&all, Get("/nope"));
  std::thread sender([&] { SendAll(fd, all); });
  int answered = 0;
  for (; answered < kRequests; ++answered) {
    const std::string response = ReadResponse(fd);
    if (!absl::StartsWith(response, "HTTP/1.1 404")) break;
  }
  sender.join();
  EXPECT_EQ(answered, kRequests);
  EXPECT_TRUE(absl::EndsWith(Request(server->port(), Get("/metrics")), kBody));
  close(fd);
}

TEST(MetricsServer, KeepAliveServesSeveralRequestsOnOneConnection) {
  Counts counts;
  auto server = Serve(&counts);
  const int fd = Connect(server->port());
  for (int i = 0; i < 3; ++i) {
    SendAll(fd, Get("/metrics"));
    const std::string response = ReadResponse(fd);
    EXPECT_TRUE(absl::StrContains(response, "Connection: keep-alive\r\n")) << response;
    EXPECT_TRUE(absl::EndsWith(response, kBody));
  }
  // Two pipelined, the second asking to close.
  SendAll(fd, absl::StrCat(Get("/metrics"), Get("/metrics", "Connection: close\r\n")));
  EXPECT_TRUE(absl::EndsWith(ReadResponse(fd), kBody));
  const std::string last = ReadResponse(fd);
  EXPECT_TRUE(absl::StrContains(last, "Connection: close\r\n")) << last;
  char byte;
  EXPECT_EQ(recv(fd, &byte, 1, 0), 0);
  close(fd);
}

std::string Basic(absl::string_view user, absl::string_view password) {
  return absl::StrCat("Authorization: Basic ",
                      absl::Base64Escape(absl::StrCat(user, ":", password)), "\r\n");
}

std::string BcryptHash(const char* password, int cost = 4) {
  char salt[CRYPT_GENSALT_OUTPUT_SIZE];
  EXPECT_NE(crypt_gensalt_rn("$2b$", cost, nullptr, 0, salt, sizeof(salt)), nullptr);
  crypt_data data{};
  const char* hash = crypt_r(password, salt, &data);
  EXPECT_NE(hash, nullptr);
  return hash;
}

TEST(MetricsServer, BasicAuth) {
  Counts counts;
  WebConfig web;
  web.basic_auth_users = {{"prometheus", BcryptHash("right")},
                          {"other", BcryptHash("x")}};
  auto server = Serve(&counts, web);
  const int port = server->port();
  const std::string none = Request(port, Get("/metrics"));
  EXPECT_TRUE(absl::StartsWith(none, "HTTP/1.1 401 ")) << none;
  EXPECT_TRUE(absl::StrContains(none, "WWW-Authenticate: Basic"));
  EXPECT_TRUE(absl::StartsWith(
      Request(port, Get("/metrics", Basic("prometheus", "wrong"))), "HTTP/1.1 401 "));
  EXPECT_TRUE(absl::StartsWith(Request(port, Get("/metrics", Basic("nobody", "right"))),
                               "HTTP/1.1 401 "));
  EXPECT_TRUE(absl::StartsWith(
      Request(port, Get("/metrics", "Authorization: Bearer x\r\n")), "HTTP/1.1 401 "));
  EXPECT_TRUE(absl::StartsWith(Request(port, Get("/", Basic("prometheus", "wrong"))),
                               "HTTP/1.1 401 "))
      << "auth comes before routing";
  EXPECT_EQ(counts[Refusal::kUnauthorized], 5);
  for (int i = 0; i < 2; ++i) {  // the second from the verified cache
    const std::string ok = Request(port, Get("/metrics", Basic("prometheus", "right")));
    EXPECT_TRUE(absl::StartsWith(ok, "HTTP/1.1 200 ")) << ok;
    EXPECT_TRUE(absl::EndsWith(ok, kBody));
  }
}

// Whether `done` came true within 20 s, checked every millisecond: for the
// server's refusal counters, which have nothing to wait on.
bool WaitUntil(const std::function<bool()>& done) {
  for (const absl::Time end = absl::Now() + absl::Seconds(20); absl::Now() < end;) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return done();
}

absl::Duration Median(std::vector<absl::Duration> d) {
  std::sort(d.begin(), d.end());
  return d[d.size() / 2];
}

// Clients that guess passwords as fast as they are answered, each on a new
// connection, against a slow bcrypt (cost 11: ~0.1 s a check on a quiet core, more
// on a loaded one). Checked on the poll thread, each guess would hold a scrape for a
// bcrypt; here a scrape whose credentials were verified once is answered from the
// cache while the guesses queue on the worker (at most auth_queue_depth of them) or
// are answered 503 at once.
TEST(MetricsServer, PasswordGuessersDoNotDelayAVerifiedScrape) {
  constexpr int kGuessers = 32;
  constexpr size_t kMaxScrapes = 20'000;
  Counts counts;
  WebConfig web;
  web.basic_auth_users = {{"prometheus", BcryptHash("right", 11)}};
  auto server = Serve(&counts, web);
  const int port = server->port();
  const std::string scrape = Get("/metrics", Basic("prometheus", "right"));
  const absl::Time first = absl::Now();
  ASSERT_TRUE(absl::StartsWith(Request(port, scrape), "HTTP/1.1 200 "));
  const absl::Duration one_bcrypt = absl::Now() - first;  // the first is checked
  std::atomic<bool> stop{false};
  std::atomic<int> unauthorized{0}, busy{0}, other{0};
  std::vector<std::thread> guessers;
  for (int g = 0; g < kGuessers; ++g) {
    guessers.emplace_back([&, g] {
      for (int i = 0; !stop; ++i) {
        const std::string r = Request(
            port, Get("/metrics", Basic("prometheus", absl::StrCat("guess", g, "-", i))));
        if (absl::StartsWith(r, "HTTP/1.1 401 ")) {
          ++unauthorized;
        } else if (absl::StartsWith(r, "HTTP/1.1 503 ") &&
                   absl::StrContains(r, "Retry-After: 1\r\n")) {
          ++busy;
        } else {
          ++other;
        }
      }
    });
  }
  // Scrapes, one after the other, from the first answered guess until two more
  // bcrypts have run on the worker (and at most kMaxScrapes).
  ASSERT_TRUE(WaitUntil([&] { return unauthorized + busy > 0; }));
  const int until = unauthorized + 2;
  std::vector<absl::Duration> took;
  while (unauthorized < until && took.size() < kMaxScrapes) {
    const absl::Time start = absl::Now();
    const std::string response = Request(port, scrape);
    took.push_back(absl::Now() - start);
    ASSERT_TRUE(absl::StartsWith(response, "HTTP/1.1 200 ")) << response;
    EXPECT_TRUE(absl::EndsWith(response, kBody));
  }
  stop = true;
  for (std::thread& t : guessers) t.join();
  const absl::Duration slowest = *std::max_element(took.begin(), took.end());
  std::printf(
      "bench: verified scrape under %d password guessers: median %s, slowest %s of %zu "
      "(one bcrypt at cost 11 here: %s); guesses answered 401: %d, 503: %d\n",
      kGuessers, absl::FormatDuration(Median(took)).c_str(),
      absl::FormatDuration(slowest).c_str(), took.size(),
      absl::FormatDuration(one_bcrypt).c_str(), unauthorized.load(), busy.load());
  EXPECT_LT(slowest, absl::Seconds(2));
  EXPECT_GT(unauthorized, 0);
  EXPECT_GT(busy, 0);
  EXPECT_EQ(other, 0) << "every guess is answered 401, or 503 with Retry-After";
  EXPECT_EQ(counts[Refusal::kUnauthorized], unauthorized);
  EXPECT_EQ(counts[Refusal::kAuthBusy], busy);
}

// A check still waiting when its connection's response deadline passes: the
// connection is closed and counted as a timeout, and the server goes on.
TEST(MetricsServer, ACredentialCheckPastTheResponseDeadlineTimesOut) {
  Counts counts;
  WebConfig web;
  // "right" at cost 12 (made once, ahead): ~0.25 s a check on a quiet core.
  web.basic_auth_users = {
      {"prometheus", "$2b$12$.k1PAYhSgqrEcEgiQ0bdk.WDt4cNLrryN6RF/oMsElE2oL2m2GKym"}};
  MetricsServerOptions options;
  options.listen = "127.0.0.1:0";
  options.web_config = web;
  options.response_timeout = absl::Milliseconds(1);
  options.render = [] { return std::string(kBody); };
  options.on_refusal = [&counts](Refusal r) { ++counts.by_reason[static_cast<int>(r)]; };
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string response =
      Request((*server)->port(), Get("/metrics", Basic("prometheus", "right")));
  EXPECT_EQ(response, "") << "closed without a response";
  EXPECT_EQ(counts[Refusal::kTimeout], 1);
  EXPECT_TRUE(
      absl::StartsWith(Request((*server)->port(), Get("/metrics")), "HTTP/1.1 401 "))
      << "no credentials: answered at once, the worker still busy";
}

// A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, made
// by the openssl binary in a fresh directory.
class Pki {
 public:
  Pki() {
    char dir_template[] = "/tmp/fuselink-pki.XXXXXX";
    dir_ = mkdtemp(dir_template);
    Run(absl::StrCat(
        "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca "
        "-keyout ",
        Path("ca.key"), " -out ", Path("ca.crt")));
    Sign("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1");
    Sign("client", "/CN=prometheus", "extendedKeyUsage=clientAuth");
  }
  ~Pki() { std::system(absl::StrCat("rm -rf ", dir_).c_str()); }

  std::string Path(absl::string_view name) const { return absl::StrCat(dir_, "/", name); }
  // A (new) certificate and key for `name`, signed by the CA.
  void Sign(absl::string_view name, absl::string_view subject, absl::string_view ext) {
    const std::string key = Path(absl::StrCat(name, ".key"));
    const std::string csr = Path(absl::StrCat(name, ".csr"));
    const std::string crt = Path(absl::StrCat(name, ".crt"));
    Run(absl::StrCat("openssl req -newkey rsa:2048 -nodes -subj ", subject, " -keyout ",
                     key, ".new -out ", csr));
    std::ofstream(Path("ext.cnf")) << ext << "\n";
    Run(absl::StrCat("openssl x509 -req -in ", csr, " -CA ", Path("ca.crt"), " -CAkey ",
                     Path("ca.key"), " -CAcreateserial -days 2 -extfile ",
                     Path("ext.cnf"), " -out ", crt, ".new"));
    // Key and certificate replace the old ones by rename, as a rotation would.
    Run(absl::StrCat("mv ", key, ".new ", key, " && mv ", crt, ".new ", crt));
  }

 private:
  static void Run(const std::string& command) {
    ASSERT_EQ(std::system(absl::StrCat(command, " >/dev/null 2>&1").c_str()), 0)
        << command;
  }
  std::string dir_;
};

struct CtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};

struct TlsResult {
  bool ok = false;          // a response was read
  std::string response;     // its bytes
  std::string peer_serial;  // the server certificate's serial, hex
};

// A TLS scrape as a client: trusts the CA; shows the client certificate if asked.
TlsResult TlsRequest(int port, const Pki& pki, bool client_cert,
                     absl::string_view request) {
  TlsResult result;
  std::unique_ptr<SSL_CTX, CtxFree> ctx(SSL_CTX_new(TLS_client_method()));
  SSL_CTX_load_verify_locations(ctx.get(), pki.Path("ca.crt").c_str(), nullptr);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (client_cert) {
    SSL_CTX_use_certificate_file(ctx.get(), pki.Path("client.crt").c_str(),
                                 SSL_FILETYPE_PEM);
    SSL_CTX_use_PrivateKey_file(ctx.get(), pki.Path("client.key").c_str(),
                                SSL_FILETYPE_PEM);
  }
  const int fd = Connect(port);
  std::unique_ptr<SSL, SslFree> ssl(SSL_new(ctx.get()));
  SSL_set_fd(ssl.get(), fd);
  X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()), "127.0.0.1");
  if (SSL_connect(ssl.get()) == 1) {
    if (X509* peer = SSL_get1_peer_certificate(ssl.get()); peer != nullptr) {
      BIGNUM* serial = ASN1_INTEGER_to_BN(X509_get_serialNumber(peer), nullptr);
      char* hex = BN_bn2hex(serial);
      result.peer_serial = hex;
      OPENSSL_free(hex);
      BN_free(serial);
      X509_free(peer);
    }
    SSL_write(ssl.get(), request.data(), static_cast<int>(request.size()));
    char chunk[4096];
    int n;
    while ((n = SSL_read(ssl.get(), chunk, sizeof(chunk))) > 0) {
      result.response.append(chunk, static_cast<size_t>(n));
      if (absl::EndsWith(result.response, kBody)) break;
    }
    result.ok = absl::StartsWith(result.response, "HTTP/1.1 ");
  } else if (std::getenv("FUSELINK_TLS_DEBUG") != nullptr) {
    ERR_print_errors_fp(stderr);
    std::fprintf(stderr, "verify: %s\n",
                 X509_verify_cert_error_string(SSL_get_verify_result(ssl.get())));
  }
  ERR_clear_error();
  close(fd);
  return result;
}

WebConfig TlsConfig(const Pki& pki, ClientAuth auth) {
  WebConfig web;
  web.tls = TlsServerConfig{pki.Path("server.crt"), pki.Path("server.key"),
                            auth == ClientAuth::kNoClientCert ? "" : pki.Path("ca.crt"),
                            auth, false};
  return web;
}

TEST(MetricsServerTls, ScrapeOverTlsWhileASlowHandshakeWaits) {
  Pki pki;
  Counts counts;
  auto server = Serve(&counts, TlsConfig(pki, ClientAuth::kNoClientCert));
  // A client that opens TLS and stops after the first bytes of its ClientHello.
  const int slow = Connect(server->port());
  SendAll(slow, std::string("\x16\x03\x01\x02\x00\x01", 6));
  const int idle = Connect(server->port());
  const std::string wanted = Get("/metrics", "Connection: close\r\n");
  const TlsResult result = TlsRequest(server->port(), pki, false, wanted);
  EXPECT_TRUE(result.ok) << result.response;
  EXPECT_TRUE(absl::StartsWith(result.response, "HTTP/1.1 200 OK")) << result.response;
  EXPECT_TRUE(absl::EndsWith(result.response, kBody));
  // Plain HTTP to the TLS port is a failed handshake.
  EXPECT_FALSE(
      absl::StartsWith(Request(server->port(), Get("/metrics")), "HTTP/1.1 200"));
  EXPECT_GE(counts[Refusal::kTls], 1);
  close(slow);
  close(idle);
}

// Clients that open TLS and never send a ClientHello, and clients that stop inside
// theirs: each is an idle descriptor in the poll set (the handshake only ever takes
// bytes already received), so a scrape beside them is answered at once.
TEST(MetricsServerTls, SilentAndStalledHandshakesDoNotHoldAScrape) {
  Pki pki;
  Counts counts;
  auto server = Serve(&counts, TlsConfig(pki, ClientAuth::kNoClientCert));
  std::vector<int> stuck;
  for (int i = 0; i < kDefaultMaxConnections - 4; ++i) {
    stuck.push_back(Connect(server->port()));
    // Every third stops after a TLS record header and the ClientHello's type.
    if (i % 3 == 0) SendAll(stuck.back(), std::string("\x16\x03\x01\x02\x00\x01", 6));
  }
  const std::string wanted = Get("/metrics", "Connection: close\r\n");
  std::vector<absl::Duration> took;
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    const TlsResult result = TlsRequest(server->port(), pki, false, wanted);
    took.push_back(absl::Now() - start);
    EXPECT_TRUE(result.ok) << result.response;
    EXPECT_TRUE(absl::EndsWith(result.response, kBody));
  }
  const absl::Duration slowest = *std::max_element(took.begin(), took.end());
  std::printf(
      "bench: TLS scrape (handshake included) beside %zu stalled handshakes: median %s, "
      "slowest %s of %zu\n",
      stuck.size(), absl::FormatDuration(Median(took)).c_str(),
      absl::FormatDuration(slowest).c_str(), took.size());
  EXPECT_LT(slowest, absl::Seconds(2));
  EXPECT_EQ(counts[Refusal::kTimeout], 0) << "request_timeout (5 s) has not passed";
  for (int fd : stuck) close(fd);
}

TEST(MetricsServerTls, RequireAndVerifyClientCert) {
  Pki pki;
  Counts counts;
  auto server = Serve(&counts, TlsConfig(pki, ClientAuth::kRequireAndVerifyClientCert));
  const std::string wanted = Get("/metrics", "Connection: close\r\n");
  const TlsResult without = TlsRequest(server->port(), pki, false, wanted);
  EXPECT_FALSE(without.ok) << without.response;
  const TlsResult with = TlsRequest(server->port(), pki, true, wanted);
  EXPECT_TRUE(with.ok);
  EXPECT_TRUE(absl::EndsWith(with.response, kBody)) << with.response;
  EXPECT_GE(counts[Refusal::kTls], 1);
}

TEST(MetricsServerTls, RotatedCertificateIsServedWithoutRestart) {
  Pki pki;
  Counts counts;
  auto server = Serve(&counts, TlsConfig(pki, ClientAuth::kNoClientCert));
  const std::string wanted = Get("/metrics", "Connection: close\r\n");
  const TlsResult before = TlsRequest(server->port(), pki, false, wanted);
  ASSERT_TRUE(before.ok);
  pki.Sign("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1");
  std::string serial = before.peer_serial;
  for (int i = 0; i < 30 && serial == before.peer_serial; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    const TlsResult after = TlsRequest(server->port(), pki, false, wanted);
    ASSERT_TRUE(after.ok);
    serial = after.peer_serial;
  }
  EXPECT_NE(serial, before.peer_serial) << "the new certificate was never served";
}

}  // namespace
}  // namespace fuselink::services::http
