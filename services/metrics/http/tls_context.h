// The server's OpenSSL context, made from a web config's tls_server_config and made
// again when the certificate, key or client CA files change (rotation without a
// restart). Not thread-safe: the metrics server's one thread owns it.
#pragma once

#include <openssl/ssl.h>

#include <array>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/metrics/http/web_config.h"

namespace fuselink::services::http {

class TlsContext {
 public:
  // How often Current() looks at the files' change times at most.
  static constexpr absl::Duration kRecheckInterval = absl::Seconds(1);

  // Loads the files; INVALID_ARGUMENT naming the file that does not load.
  static absl::StatusOr<std::unique_ptr<TlsContext>> Create(
      const TlsServerConfig& config);

  // The context new connections take: reloaded first when a file changed since the
  // last load. A reload that fails keeps the previous context (and is retried on
  // the next change); its error is in last_reload_error(). Connections already
  // made keep the context they took (OpenSSL counts its references).
  SSL_CTX* Current(absl::Time now);
  const absl::Status& last_reload_error() const { return last_reload_error_; }
  int reloads() const { return reloads_; }

 private:
  struct CtxFree {
    void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
  };
  // What tells a file changed: modification time, size and inode.
  struct Stamp {
    int64_t mtime_ns = 0;
    int64_t size = -1;
    uint64_t inode = 0;
    bool operator==(const Stamp&) const = default;
  };
  using Stamps = std::array<Stamp, 3>;  // cert, key, client CA

  explicit TlsContext(TlsServerConfig config) : config_(std::move(config)) {}
  Stamps Look() const;
  absl::StatusOr<std::unique_ptr<SSL_CTX, CtxFree>> Build() const;

  const TlsServerConfig config_;
  std::unique_ptr<SSL_CTX, CtxFree> ctx_;
  Stamps stamps_;
  absl::Time checked_ = absl::InfinitePast();
  absl::Status last_reload_error_;
  int reloads_ = 0;
};

}  // namespace fuselink::services::http
