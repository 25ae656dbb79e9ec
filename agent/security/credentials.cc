#include "agent/security/credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace fuselink::security {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view what) {
  auto bad = [&](absl::string_view why) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(what, " '", path, "': ", why)),
        reasons::kBadTlsFiles);
  };
  if (path.empty()) return bad("not given");
  std::ifstream in(path);
  if (!in) return bad("cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) return bad("holds no PEM");
  return text.str();
}

// Accepts a server only when its certificate's URI SANs name `identity`. Runs after
// the chain was verified against the CA.
class IdentityVerifier final : public grpc::experimental::ExternalCertificateVerifier {
 public:
  explicit IdentityVerifier(std::string identity) : identity_(std::move(identity)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)>, grpc::Status* sync_status) override {
    for (const grpc::string_ref& uri : request->uri_names()) {
      if (absl::string_view(uri.data(), uri.size()) == identity_) {
        *sync_status = grpc::Status::OK;
        return true;
      }
    }
    *sync_status =
        grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                     absl::StrCat("the peer's certificate does not name ", identity_));
    return true;
  }
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  const std::string identity_;
};

}  // namespace

absl::Status CheckTlsFiles(const TlsFiles& files) {
  FL_RETURN_IF_ERROR(ReadPem(files.cert_file, "--tls_cert").status());
  FL_RETURN_IF_ERROR(ReadPem(files.key_file, "--tls_key").status());
  FL_RETURN_IF_ERROR(ReadPem(files.ca_file, "--tls_ca").status());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TlsCredentials>> TlsCredentials::Create(
    const TlsFiles& files) {
  // gRPC watches the vetted copies, never the operator's files themselves.
  FL_ASSIGN_OR_RETURN(std::unique_ptr<TlsStage> stage, TlsStage::Create(files));
  const TlsFiles& staged = stage->staged();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      staged.key_file, staged.cert_file, staged.ca_file, std::max(1u, files.refresh_s));
  return std::unique_ptr<TlsCredentials>(
      new TlsCredentials(std::move(stage), std::move(provider)));
}

std::shared_ptr<grpc::ServerCredentials> TlsCredentials::Server() const {
  grpc::experimental::TlsServerCredentialsOptions options(provider_);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> TlsCredentials::ToPeer(
    const std::string& identity) const {
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider_);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  // Peers are dialled by address; what they must prove is their identity.
  options.set_check_call_host(false);
  options.set_certificate_verifier(
      grpc::experimental::ExternalCertificateVerifier::Create<IdentityVerifier>(
          identity));
  return grpc::experimental::TlsCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ClientChannel(
    const std::string& address, const TlsFiles& files, const std::string& server_name) {
  grpc::SslCredentialsOptions ssl;
  FL_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem(files.cert_file, "--tls_cert"));
  FL_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem(files.key_file, "--tls_key"));
  FL_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(files.ca_file, "--tls_ca"));
  grpc::ChannelArguments args;
  if (!server_name.empty()) args.SetSslTargetNameOverride(server_name);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

void TlsCredentials::ReportStats(stats::Sink& sink) const {
  static constexpr stats::Family kReloads{
      "fuselink_tls_reloads_total",
      "Rotations of the gRPC TLS files (--tls_cert, --tls_key, --tls_ca) that checked "
      "out and serve new connections.",
      stats::Kind::kCounter};
  static constexpr stats::Family kFailures{
      "fuselink_tls_reload_failures_total",
      "Rotations of the gRPC TLS files refused: a file that does not parse, or a key "
      "that is not the certificate's. The last good set keeps serving; the agent's log "
      "says why.",
      stats::Kind::kCounter};
  const TlsStage::Counts counts = reload_counts();
  sink.Add(kReloads, static_cast<double>(counts.reloads));
  sink.Add(kFailures, static_cast<double>(counts.failed_reloads));
}

}  // namespace fuselink::security
