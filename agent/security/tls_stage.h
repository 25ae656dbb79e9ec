// The TLS files gRPC serves from, vetted first. gRPC 1.51's
// FileWatcherCertificateProvider hands whatever its files hold to every new
// handshake without parsing it or matching the key to the certificate (its source
// says so: a TODO to match them), so a certificate replaced by garbage would fail
// every new connection, with nothing in the agent's logs or metrics to say why.
//
// A TlsStage reads the operator's files, and only when the certificate chain, the
// key and the CA all parse and the key matches the certificate, copies them into a
// private directory (0700) that the provider watches instead. A rotation that does
// not check out is logged once (one line, with the reason) and counted; the staged
// copy, the last good set, stays, and new connections keep being served with it.
// The operator's files are looked at every `refresh_s` (stat: mtime, size, inode);
// a set is re-read only when one of them changed.
//
// Thread-safe; one thread of its own, joined by the destructor, which also removes
// the private directory.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace fuselink::security {

struct TlsFiles;

// INVALID_ARGUMENT (BAD_TLS_FILES) unless `cert_pem` is a chain of certificates
// whose first matches `key_pem`, and `ca_pem` holds at least one certificate.
absl::Status CheckTlsPems(const std::string& cert_pem, const std::string& key_pem,
                          const std::string& ca_pem);

class TlsStage {
 public:
  struct Counts {
    uint64_t reloads = 0;         // rotations vetted and staged (not the first load)
    uint64_t failed_reloads = 0;  // rotations refused: the last good set stays
  };

  // Vets `files` and stages them; INVALID_ARGUMENT (BAD_TLS_FILES) when they do
  // not check out: an agent does not start on files it could not serve.
  static absl::StatusOr<std::unique_ptr<TlsStage>> Create(const TlsFiles& files);
  ~TlsStage();
  TlsStage(const TlsStage&) = delete;
  TlsStage& operator=(const TlsStage&) = delete;

  // The staged copies, for the certificate provider (refresh_s as given).
  const TlsFiles& staged() const { return *staged_; }
  Counts counts() const;
  // Looks at the operator's files now, as the thread does every refresh_s.
  void CheckNow();

 private:
  // mtime (ns), size and inode of each of the three files.
  using Stamps = std::array<std::array<int64_t, 3>, 3>;
  TlsStage(std::unique_ptr<TlsFiles> source, std::unique_ptr<TlsFiles> staged);
  Stamps Look() const;
  // Reads and vets the operator's files, then replaces the staged copies.
  absl::Status Stage() const;
  void Loop();

  const std::unique_ptr<TlsFiles> source_;
  const std::unique_ptr<TlsFiles> staged_;
  std::string dir_;  // the private directory, removed on destruction
  absl::Mutex mu_;   // one check at a time
  Stamps stamps_ ABSL_GUARDED_BY(mu_){};
  std::atomic<uint64_t> reloads_{0};
  std::atomic<uint64_t> failed_reloads_{0};
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace fuselink::security
