#include "tests/integration/pki.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tests/integration/agent_process.h"

namespace fuselink::testing {
namespace {

absl::Mutex pki_mu;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

const std::string& PkiDir() {
  static TempDir* dir = new TempDir();  // lives as long as the binary
  return dir->path();
}

std::string MakeCert(const std::string& kind, const std::string& name,
                     const std::string& dir, int days) {
  const std::string where = dir.empty() ? PkiDir() : dir;
  const std::string stem = absl::StrCat(where, "/", kind, "-", name);
  absl::MutexLock lock(&pki_mu);
  if (!std::ifstream(stem + ".crt").good()) {
    const std::string command = absl::StrCat("DAYS=", days, " '", FUSELINK_CERTS_SCRIPT,
                                             "' '", where, "' '", kind, "' '", name, "'");
    if (std::system(command.c_str()) != 0) {
      std::fprintf(stderr, "pki: %s failed\n", command.c_str());
      std::abort();
    }
  }
  return stem;
}

std::vector<std::string> AgentTlsFlags(const std::string& node, bool harness_policy) {
  const std::string stem = MakeCert("node", node);
  const std::string policy = absl::StrCat(PkiDir(), "/policy.json");
  {
    absl::MutexLock lock(&pki_mu);
    if (!std::ifstream(policy).good()) {
      std::ofstream out(policy);
      out << R"({"bindings": [
  {"identity": "spiffe://fuselink/node/*", "roles": ["peer"]},
  {"identity": "spiffe://fuselink/router/*", "roles": ["router", "viewer"]},
  {"identity": "spiffe://fuselink/engine/*", "roles": ["engine"]},
  {"identity": "spiffe://fuselink/viewer/*", "roles": ["viewer"]},
  {"identity": "spiffe://fuselink/test/client", "roles": ["router", "engine", "viewer"]}
]}
)";
    }
  }
  return {absl::StrCat("--tls_cert=", stem, ".crt"),
          absl::StrCat("--tls_key=", stem, ".key"),
          absl::StrCat("--tls_ca=", PkiDir(), "/ca.crt"), "--tls_refresh_s=1",
          absl::StrCat("--access_policy=", policy)};
}

std::shared_ptr<grpc::Channel> ChannelWith(const std::string& address,
                                           const std::string& ca_file,
                                           const std::string& stem) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadAll(ca_file);
  if (!stem.empty()) {
    ssl.pem_cert_chain = ReadAll(stem + ".crt");
    ssl.pem_private_key = ReadAll(stem + ".key");
  }
  return grpc::CreateChannel(address, grpc::SslCredentials(ssl));
}

std::shared_ptr<grpc::Channel> ClientChannel(const std::string& address,
                                             const std::string& kind,
                                             const std::string& name) {
  MakeCert("node", "ca-only");  // makes the CA if nothing has yet
  return ChannelWith(address, absl::StrCat(PkiDir(), "/ca.crt"),
                     kind.empty() ? "" : MakeCert(kind, name));
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsAs(const std::string& kind,
                                                             const std::string& name) {
  const std::string stem = MakeCert(kind, name);
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = ReadAll(PkiDir() + "/ca.crt");
  options.pem_key_cert_pairs.push_back({ReadAll(stem + ".key"), ReadAll(stem + ".crt")});
  return grpc::SslServerCredentials(options);
}

}  // namespace fuselink::testing
