#include "services/metrics/http/tls_context.h"

#include <openssl/err.h>
#include <sys/stat.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fuselink::services::http {
namespace {

// OpenSSL's error queue as text, emptied.
std::string OpenSslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(e, buffer, sizeof(buffer));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buffer);
  }
  return out.empty() ? "no OpenSSL error recorded" : out;
}

absl::Status LoadError(absl::string_view what, const std::string& file) {
  return absl::InvalidArgumentError(
      absl::StrCat("TLS ", what, " ", file, ": ", OpenSslErrors()));
}

// Accepts any certificate a client shows (RequestClientCert, RequireAnyClientCert).
int AcceptAny(int /*preverified*/, X509_STORE_CTX* /*store*/) { return 1; }

}  // namespace

absl::StatusOr<std::unique_ptr<TlsContext>> TlsContext::Create(
    const TlsServerConfig& config) {
  std::unique_ptr<TlsContext> tls(new TlsContext(config));
  tls->stamps_ = tls->Look();
  absl::StatusOr<std::unique_ptr<SSL_CTX, CtxFree>> ctx = tls->Build();
  if (!ctx.ok()) return ctx.status();
  tls->ctx_ = *std::move(ctx);
  return tls;
}

TlsContext::Stamps TlsContext::Look() const {
  Stamps stamps;
  const std::string* files[] = {&config_.cert_file, &config_.key_file,
                                &config_.client_ca_file};
  for (size_t i = 0; i < stamps.size(); ++i) {
    struct stat st;
    if (files[i]->empty() || stat(files[i]->c_str(), &st) != 0) continue;
    stamps[i] = {
        static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
        static_cast<int64_t>(st.st_size), static_cast<uint64_t>(st.st_ino)};
  }
  return stamps;
}

absl::StatusOr<std::unique_ptr<SSL_CTX, TlsContext::CtxFree>> TlsContext::Build() const {
  ERR_clear_error();
  std::unique_ptr<SSL_CTX, CtxFree> ctx(SSL_CTX_new(TLS_server_method()));
  if (ctx == nullptr)
    return absl::InternalError(absl::StrCat("SSL_CTX_new: ", OpenSslErrors()));
  SSL_CTX_set_min_proto_version(ctx.get(),
                                config_.min_tls13 ? TLS1_3_VERSION : TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx.get(),
                   SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // No resumption state kept between connections: nothing to bound or expire.
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), config_.cert_file.c_str()) != 1) {
    return LoadError("cert_file", config_.cert_file);
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), config_.key_file.c_str(),
                                  SSL_FILETYPE_PEM) != 1) {
    return LoadError("key_file", config_.key_file);
  }
  if (SSL_CTX_check_private_key(ctx.get()) != 1) {
    return LoadError("key_file (does not match cert_file)", config_.key_file);
  }
  if (!config_.client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx.get(), config_.client_ca_file.c_str(),
                                      nullptr) != 1) {
      return LoadError("client_ca_file", config_.client_ca_file);
    }
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(config_.client_ca_file.c_str());
    if (names == nullptr) return LoadError("client_ca_file", config_.client_ca_file);
    SSL_CTX_set_client_CA_list(ctx.get(), names);  // takes ownership
  }
  switch (config_.client_auth) {
    case ClientAuth::kNoClientCert:
      SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
      break;
    case ClientAuth::kRequestClientCert:
      SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, AcceptAny);
      break;
    case ClientAuth::kRequireAnyClientCert:
      SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                         AcceptAny);
      break;
    case ClientAuth::kVerifyClientCertIfGiven:
      SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
      break;
    case ClientAuth::kRequireAndVerifyClientCert:
      SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                         nullptr);
      break;
  }
  return ctx;
}

SSL_CTX* TlsContext::Current(absl::Time now) {
  if (now - checked_ >= kRecheckInterval) {
    checked_ = now;
    const Stamps stamps = Look();
    if (stamps != stamps_) {
      stamps_ = stamps;
      absl::StatusOr<std::unique_ptr<SSL_CTX, CtxFree>> ctx = Build();
      if (ctx.ok()) {
        ctx_ = *std::move(ctx);
        last_reload_error_ = absl::OkStatus();
        ++reloads_;
      } else {
        last_reload_error_ = ctx.status();
      }
    }
  }
  return ctx_.get();
}

}  // namespace fuselink::services::http
