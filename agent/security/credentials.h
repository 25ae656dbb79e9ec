// gRPC over mutual TLS from certificate files: the agent's server, its calls to peer
// agents, and clients of the Agent API (tools, tests). The files are watched: a
// rotated certificate, key or CA (cert-manager renews them in place) is used for new
// connections within about two refresh_s, without a restart, once it checks out; one
// that does not is logged and counted, and the last good set stays (tls_stage.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/common/stats.h"
#include "agent/security/tls_stage.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/tls_certificate_provider.h"

namespace fuselink::security {

struct TlsFiles {
  std::string cert_file;  // PEM: this side's certificate (chain)
  std::string key_file;   // PEM: its private key
  std::string ca_file;    // PEM: the CA that signs every certificate we accept
  unsigned refresh_s = 10;
};

// INVALID_ARGUMENT (BAD_TLS_FILES) unless each file is readable and holds PEM.
absl::Status CheckTlsFiles(const TlsFiles& files);

class TlsCredentials {
 public:
  static absl::StatusOr<std::unique_ptr<TlsCredentials>> Create(const TlsFiles& files);

  // Requests a client certificate and verifies any it is shown against the CA; a
  // call without one still arrives, for the guard to refuse UNAUTHENTICATED with a
  // reason.
  std::shared_ptr<grpc::ServerCredentials> Server() const;
  // To a peer agent, which must prove `identity` (its SPIFFE ID) whatever address it
  // is dialled at.
  std::shared_ptr<grpc::ChannelCredentials> ToPeer(const std::string& identity) const;
  // Rotations of the files staged, and refused (the last good set kept).
  TlsStage::Counts reload_counts() const { return stage_->counts(); }

  // The TLS files' rotations that served, and those refused.
  void ReportStats(stats::Sink& sink) const;

 private:
  TlsCredentials(
      std::unique_ptr<TlsStage> stage,
      std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider)
      : stage_(std::move(stage)), provider_(std::move(provider)) {}
  std::unique_ptr<TlsStage> stage_;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
};

// A client of the Agent API: presents `files`' certificate and checks the agent's
// against the CA and `server_name` (one of its DNS or IP SANs; empty: the host it
// dials). Read once: clients are short-lived.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ClientChannel(
    const std::string& address, const TlsFiles& files, const std::string& server_name);

}  // namespace fuselink::security
