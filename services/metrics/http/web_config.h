// The web-config file of --metrics_web_config, in the format Prometheus exporters
// read (exporter-toolkit's): TLS for the endpoint and HTTP basic auth users.
//
//   tls_server_config:
//     cert_file: server.crt        # PEM chain; relative paths are to the file's folder
//     key_file: server.key
//     client_ca_file: ca.crt       # needed by the *Verify* client_auth_types
//     client_auth_type: RequireAndVerifyClientCert
//     min_version: TLS12           # TLS12 (default) or TLS13
//   basic_auth_users:
//     prometheus: $2b$10$...       # bcrypt hash ($2a$, $2b$ or $2y$)
//
// Any other key is refused, naming its line: a typo must not turn TLS or auth off.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fuselink::services::http {

// What a TLS client must show, named as in Go's tls.ClientAuthType.
enum class ClientAuth {
  kNoClientCert,
  kRequestClientCert,           // asked for, not checked
  kRequireAnyClientCert,        // required, not checked against client_ca_file
  kVerifyClientCertIfGiven,     // checked when shown
  kRequireAndVerifyClientCert,  // required and checked
};

struct TlsServerConfig {
  std::string cert_file;       // absolute after Parse
  std::string key_file;        // absolute after Parse
  std::string client_ca_file;  // empty: none
  ClientAuth client_auth = ClientAuth::kNoClientCert;
  bool min_tls13 = false;  // min_version TLS13; else TLS 1.2
};

struct WebConfig {
  std::optional<TlsServerConfig> tls;  // absent: plain HTTP
  // User names and their bcrypt hashes, in file order; empty: no auth.
  std::vector<std::pair<std::string, std::string>> basic_auth_users;
};

// Parses a web config; relative file names are taken from `base_dir`.
absl::StatusOr<WebConfig> ParseWebConfig(absl::string_view text,
                                         absl::string_view base_dir);
// Reads and parses the file at `path` (NOT_FOUND when it cannot be read).
absl::StatusOr<WebConfig> LoadWebConfig(const std::string& path);

// Whether `password` hashes to `hash` (a bcrypt hash, as crypt(3) writes it), by
// libcrypt's crypt_r and a constant-time comparison. Costs the hash's work factor
// (tens of milliseconds at cost 10); false for a hash crypt_r does not take.
bool BcryptMatches(absl::string_view password, const std::string& hash);

}  // namespace fuselink::services::http
