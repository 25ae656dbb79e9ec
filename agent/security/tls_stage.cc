#include "agent/security/tls_stage.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "agent/common/check.h"
#include "agent/common/status_macros.h"
#include "agent/security/credentials.h"

namespace fuselink::security {
namespace {

absl::Status BadFiles(absl::string_view why) {
  return WithReason(absl::InvalidArgumentError(why), reasons::kBadTlsFiles);
}

// OpenSSL's first queued error, as text, and the queue cleared.
std::string OpensslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM block";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;

Bio BioOf(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of `pem`; the rest must parse too.
absl::StatusOr<std::unique_ptr<X509, X509Free>> ParseChain(const std::string& pem,
                                                           absl::string_view what) {
  Bio bio = BioOf(pem);
  std::unique_ptr<X509, X509Free> first(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (first == nullptr) {
    return BadFiles(absl::StrCat(what, " holds no certificate: ", OpensslError()));
  }
  while (std::unique_ptr<X509, X509Free>(
             PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) != nullptr) {
  }
  // The loop ends at the end of the text (PEM_R_NO_START_LINE) or at a bad block.
  const unsigned long last = ERR_peek_last_error();
  if (last != 0 && !(ERR_GET_LIB(last) == ERR_LIB_PEM &&
                     ERR_GET_REASON(last) == PEM_R_NO_START_LINE)) {
    return BadFiles(absl::StrCat(what, " holds a bad certificate: ", OpensslError()));
  }
  ERR_clear_error();
  return first;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path);
  if (!in) return BadFiles(absl::StrCat(what, " '", path, "' cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes `text` to `path` through a file beside it, renamed over it: a reader sees
// the old file or the new one, whole.
absl::Status WriteAtomically(const std::string& path, const std::string& text) {
  const std::string temp = path + ".new";
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(absl::StrCat("open(", temp, ")"), errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      close(fd);
      return ErrnoStatus(absl::StrCat("write(", temp, ")"), err);
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) return ErrnoStatus(absl::StrCat("close(", temp, ")"), errno);
  if (rename(temp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(absl::StrCat("rename(", temp, ")"), errno);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTlsPems(const std::string& cert_pem, const std::string& key_pem,
                          const std::string& ca_pem) {
  ERR_clear_error();
  FL_ASSIGN_OR_RETURN(auto cert, ParseChain(cert_pem, "--tls_cert"));
  FL_RETURN_IF_ERROR(ParseChain(ca_pem, "--tls_ca").status());
  Bio bio = BioOf(key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return BadFiles(absl::StrCat("--tls_key holds no private key: ", OpensslError()));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return BadFiles("--tls_key is not the key of --tls_cert's certificate");
  }
  return absl::OkStatus();
}

TlsStage::TlsStage(std::unique_ptr<TlsFiles> source, std::unique_ptr<TlsFiles> staged)
    : source_(std::move(source)), staged_(std::move(staged)) {}

absl::StatusOr<std::unique_ptr<TlsStage>> TlsStage::Create(const TlsFiles& files) {
  FL_RETURN_IF_ERROR(CheckTlsFiles(files));
  const char* tmp = getenv("TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp",
                                     "/fuselink-tls-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) return ErrnoStatus("mkdtemp(tls)", errno);
  auto staged = std::make_unique<TlsFiles>(
      TlsFiles{absl::StrCat(pattern, "/cert.pem"), absl::StrCat(pattern, "/key.pem"),
               absl::StrCat(pattern, "/ca.pem"), files.refresh_s});
  std::unique_ptr<TlsStage> stage(
      new TlsStage(std::make_unique<TlsFiles>(files), std::move(staged)));
  stage->dir_ = pattern;
  {
    absl::MutexLock lock(&stage->mu_);
    stage->stamps_ = stage->Look();
  }
  FL_RETURN_IF_ERROR(stage->Stage());
  stage->thread_ = std::thread([s = stage.get()] { s->Loop(); });
  return stage;
}

TlsStage::~TlsStage() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
  for (const std::string* path :
       {&staged_->cert_file, &staged_->key_file, &staged_->ca_file}) {
    unlink(path->c_str());
    unlink((*path + ".new").c_str());
  }
  if (!dir_.empty()) rmdir(dir_.c_str());
}

TlsStage::Counts TlsStage::counts() const {
  return Counts{reloads_.load(), failed_reloads_.load()};
}

TlsStage::Stamps TlsStage::Look() const {
  Stamps stamps{};
  const std::string* files[] = {&source_->cert_file, &source_->key_file,
                                &source_->ca_file};
  for (size_t i = 0; i < stamps.size(); ++i) {
    struct stat st;
    if (stat(files[i]->c_str(), &st) != 0) continue;
    stamps[i] = {int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec,
                 static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_ino)};
  }
  return stamps;
}

absl::Status TlsStage::Stage() const {
  FL_ASSIGN_OR_RETURN(std::string cert, ReadFile(source_->cert_file, "--tls_cert"));
  FL_ASSIGN_OR_RETURN(std::string key, ReadFile(source_->key_file, "--tls_key"));
  FL_ASSIGN_OR_RETURN(std::string ca, ReadFile(source_->ca_file, "--tls_ca"));
  FL_RETURN_IF_ERROR(CheckTlsPems(cert, key, ca));
  // The provider reads key then certificate and rereads both when either changed
  // under it; a look between the renames below can still pair the new key with the
  // old certificate until its next look, refresh_s later.
  FL_RETURN_IF_ERROR(WriteAtomically(staged_->ca_file, ca));
  FL_RETURN_IF_ERROR(WriteAtomically(staged_->key_file, key));
  return WriteAtomically(staged_->cert_file, cert);
}

void TlsStage::CheckNow() {
  absl::MutexLock lock(&mu_);
  const Stamps stamps = Look();
  if (stamps == stamps_) return;
  stamps_ = stamps;  // a failed set is not retried until a file changes again
  if (absl::Status staged = Stage(); staged.ok()) {
    reloads_.fetch_add(1);
    std::fprintf(stderr,
                 "fuselink-agent: TLS files changed: staged for new connections\n");
  } else {
    failed_reloads_.fetch_add(1);
    std::fprintf(stderr,
                 "fuselink-agent: TLS files changed but are not served, the last good "
                 "ones stay: %s\n",
                 staged.ToString().c_str());
  }
}

void TlsStage::Loop() {
  NameThisThread("fl-tls-stage");
  const absl::Duration period = absl::Seconds(std::max(1u, source_->refresh_s));
  while (!stop_.WaitForNotificationWithTimeout(period)) CheckNow();
}

}  // namespace fuselink::security
