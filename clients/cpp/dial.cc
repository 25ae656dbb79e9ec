#include "clients/cpp/dial.h"

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "agent/security/credentials.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate this tool presents to the agent (scripts/certs.sh makes one: "
          "a router's for transfers, an engine's for its tensors, a viewer's to look).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA the agent's certificate must chain to.");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name the agent's certificate must carry (one of its DNS or IP SANs); "
          "empty: the host dialled.");
ABSL_FLAG(std::string, engine_tls_cert, "",
          "Certificate that registers and unregisters tensors where a tool does both "
          "that and transfers (demo, fuselink-bench); empty: --tls_cert.");
ABSL_FLAG(std::string, engine_tls_key, "",
          "PEM private key of --engine_tls_cert; empty: --tls_key.");
ABSL_FLAG(bool, plaintext, false,
          "Talk to an agent started with --plaintext: no TLS, no identity.");

namespace fuselink::client {

absl::StatusOr<std::shared_ptr<grpc::Channel>> DialAgent(const std::string& address,
                                                         Speaker speaker) {
  security::TlsFiles files{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                           absl::GetFlag(FLAGS_tls_ca)};
  const bool any_tls =
      !files.cert_file.empty() || !files.key_file.empty() || !files.ca_file.empty();
  if (absl::GetFlag(FLAGS_plaintext)) {
    if (any_tls) {
      return absl::InvalidArgumentError(
          "--plaintext and --tls_* contradict each other: pass one or the other");
    }
    return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  }
  if (files.cert_file.empty() || files.key_file.empty() || files.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "the agent serves mutual TLS: pass --tls_cert, --tls_key and --tls_ca "
        "(scripts/certs.sh makes them), or --plaintext for an agent started with "
        "--plaintext");
  }
  if (speaker == Speaker::kEngine) {
    if (std::string cert = absl::GetFlag(FLAGS_engine_tls_cert); !cert.empty()) {
      files.cert_file = cert;
    }
    if (std::string key = absl::GetFlag(FLAGS_engine_tls_key); !key.empty()) {
      files.key_file = key;
    }
  }
  return security::ClientChannel(address, files, absl::GetFlag(FLAGS_tls_server_name));
}

}  // namespace fuselink::client
