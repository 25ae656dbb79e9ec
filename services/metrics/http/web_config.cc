#include "services/metrics/http/web_config.h"

#include <crypt.h>
#include <openssl/crypto.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "services/metrics/http/strict_yaml.h"

namespace fuselink::services::http {
namespace {

absl::Status Error(const YamlNode& node, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("web config line ", node.line, ": ", node.key, ": ", what));
}

absl::StatusOr<std::string> Scalar(const YamlNode& node) {
  if (node.is_mapping) return Error(node, "expects a value, not a mapping");
  if (node.scalar.empty()) return Error(node, "is empty");
  return node.scalar;
}

std::string Resolve(absl::string_view base_dir, const std::string& file) {
  if (file.empty() || file[0] == '/' || base_dir.empty()) return file;
  return absl::StrCat(base_dir, "/", file);
}

absl::StatusOr<ClientAuth> ParseClientAuth(const YamlNode& node) {
  absl::StatusOr<std::string> v = Scalar(node);
  if (!v.ok()) return v.status();
  static constexpr std::pair<absl::string_view, ClientAuth> kNames[] = {
      {"NoClientCert", ClientAuth::kNoClientCert},
      {"RequestClientCert", ClientAuth::kRequestClientCert},
      {"RequireAnyClientCert", ClientAuth::kRequireAnyClientCert},
      {"VerifyClientCertIfGiven", ClientAuth::kVerifyClientCertIfGiven},
      {"RequireAndVerifyClientCert", ClientAuth::kRequireAndVerifyClientCert},
  };
  for (const auto& [name, auth] : kNames) {
    if (*v == name) return auth;
  }
  return Error(node, absl::StrCat("unknown '", *v,
                                  "' (NoClientCert, RequestClientCert, "
                                  "RequireAnyClientCert, VerifyClientCertIfGiven or "
                                  "RequireAndVerifyClientCert)"));
}

absl::StatusOr<TlsServerConfig> ParseTls(const YamlNode& node,
                                         absl::string_view base_dir) {
  if (!node.is_mapping) return Error(node, "expects a mapping");
  TlsServerConfig tls;
  for (const YamlNode& child : node.children) {
    if (child.key == "client_auth_type") {
      absl::StatusOr<ClientAuth> auth = ParseClientAuth(child);
      if (!auth.ok()) return auth.status();
      tls.client_auth = *auth;
      continue;
    }
    absl::StatusOr<std::string> v = Scalar(child);
    if (!v.ok()) return v.status();
    if (child.key == "cert_file") {
      tls.cert_file = Resolve(base_dir, *v);
    } else if (child.key == "key_file") {
      tls.key_file = Resolve(base_dir, *v);
    } else if (child.key == "client_ca_file") {
      tls.client_ca_file = Resolve(base_dir, *v);
    } else if (child.key == "min_version") {
      if (*v != "TLS12" && *v != "TLS13") {
        return Error(child, absl::StrCat("unknown '", *v, "' (TLS12 or TLS13)"));
      }
      tls.min_tls13 = *v == "TLS13";
    } else {
      return Error(child,
                   "unknown key (cert_file, key_file, client_ca_file, "
                   "client_auth_type or min_version)");
    }
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return Error(node, "needs both cert_file and key_file");
  }
  const bool verifies = tls.client_auth == ClientAuth::kVerifyClientCertIfGiven ||
                        tls.client_auth == ClientAuth::kRequireAndVerifyClientCert;
  if (verifies && tls.client_ca_file.empty()) {
    return Error(node, "client_auth_type that verifies needs client_ca_file");
  }
  return tls;
}

bool IsBcrypt(absl::string_view hash) {
  // $2b$NN$ then 53 characters of salt and hash.
  if (hash.size() != 60) return false;
  if (!absl::StartsWith(hash, "$2a$") && !absl::StartsWith(hash, "$2b$") &&
      !absl::StartsWith(hash, "$2y$")) {
    return false;
  }
  return hash[6] == '$';
}

}  // namespace

absl::StatusOr<WebConfig> ParseWebConfig(absl::string_view text,
                                         absl::string_view base_dir) {
  absl::StatusOr<YamlNode> root = ParseStrictYaml(text);
  if (!root.ok()) return root.status();
  WebConfig config;
  for (const YamlNode& node : root->children) {
    if (node.key == "tls_server_config") {
      absl::StatusOr<TlsServerConfig> tls = ParseTls(node, base_dir);
      if (!tls.ok()) return tls.status();
      config.tls = *std::move(tls);
    } else if (node.key == "basic_auth_users") {
      if (!node.is_mapping) return Error(node, "expects a mapping of user: bcrypt hash");
      for (const YamlNode& user : node.children) {
        absl::StatusOr<std::string> hash = Scalar(user);
        if (!hash.ok()) return hash.status();
        if (!IsBcrypt(*hash)) {
          return Error(user, "not a bcrypt hash ($2a$, $2b$ or $2y$, 60 characters)");
        }
        if (user.key.find(':') != std::string::npos) {
          return Error(user, "a user name cannot hold ':' (basic auth splits there)");
        }
        config.basic_auth_users.emplace_back(user.key, *hash);
      }
    } else {
      return Error(node, "unknown key (tls_server_config or basic_auth_users)");
    }
  }
  return config;
}

absl::StatusOr<WebConfig> LoadWebConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("web config ", path, ": cannot read"));
  std::ostringstream text;
  text << in.rdbuf();
  const size_t slash = path.rfind('/');
  const std::string base_dir = slash == std::string::npos ? "." : path.substr(0, slash);
  absl::StatusOr<WebConfig> config = ParseWebConfig(text.str(), base_dir);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

bool BcryptMatches(absl::string_view password, const std::string& hash) {
  FL_MAY_BLOCK();  // tens of milliseconds by design: never on the server's poll loop
  if (!IsBcrypt(hash) || password.find('\0') != absl::string_view::npos) return false;
  auto data = std::make_unique<crypt_data>();  // ~32 KiB: not on the stack
  const std::string key(password);
  const char* out = crypt_r(key.c_str(), hash.c_str(), data.get());
  if (out == nullptr || out[0] == '*') return false;
  const absl::string_view got(out);
  return got.size() == hash.size() &&
         CRYPTO_memcmp(got.data(), hash.data(), hash.size()) == 0;
}

}  // namespace fuselink::services::http
