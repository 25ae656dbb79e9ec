// The TLS files gRPC serves from: only a set that checks out is staged; a bad rotation
// is counted and the last good set stays, byte for byte.
#include "agent/security/tls_stage.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/security/credentials.h"
#include "gtest/gtest.h"

namespace fuselink::security {
namespace {

// A fresh P-256 key and a self-signed certificate for it, as PEM.
struct Pair {
  std::string cert, key;
};
Pair MakePair(long serial) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_EC_gen("P-256"),
                                                          EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(X509_new(), X509_free);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("t"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509_sign(cert.get(), key.get(), EVP_sha256());
  auto pem = [](auto write) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
    write(bio.get());
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio.get(), &data);
    return std::string(data, static_cast<size_t>(n));
  };
  return Pair{pem([&](BIO* b) { PEM_write_bio_X509(b, cert.get()); }), pem([&](BIO* b) {
                PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr,
                                         nullptr);
              })};
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes a whole file and renames it into place: one change.
void Write(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path + ".tmp", std::ios::trunc);
    out << text;
  }
  ASSERT_EQ(rename((path + ".tmp").c_str(), path.c_str()), 0);
}

TEST(CheckTlsPems, EachBadFileIsNamed) {
  const Pair a = MakePair(1), b = MakePair(2);
  EXPECT_TRUE(CheckTlsPems(a.cert, a.key, b.cert).ok());
  for (auto [cert, key, ca] :
       {std::tuple{std::string("garbage"), a.key, b.cert},
        std::tuple{std::string("-----BEGIN CERTIFICATE-----\nAAAA\n-----END "
                               "CERTIFICATE-----\n"),
                   a.key, b.cert},
        std::tuple{a.cert, std::string("garbage"), b.cert},
        std::tuple{a.cert, b.key, b.cert},  // another certificate's key
        std::tuple{a.cert, a.key, std::string()}}) {
    const absl::Status status = CheckTlsPems(cert, key, ca);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(ReasonOf(status), "BAD_TLS_FILES") << status;
  }
}

class TlsStageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/fuselink-tls-stage-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    files_ = TlsFiles{dir_ + "/cert.pem", dir_ + "/key.pem", dir_ + "/ca.pem", 1};
  }
  void TearDown() override {
    for (const std::string* f : {&files_.cert_file, &files_.key_file, &files_.ca_file}) {
      unlink(f->c_str());
    }
    rmdir(dir_.c_str());
  }
  std::string dir_;
  TlsFiles files_;
};

TEST_F(TlsStageTest, ABadRotationIsCountedAndTheLastGoodSetStays) {
  const Pair good = MakePair(1), ca = MakePair(2), next = MakePair(3);
  Write(files_.cert_file, good.cert);
  Write(files_.key_file, good.key);
  Write(files_.ca_file, ca.cert);
  absl::StatusOr<std::unique_ptr<TlsStage>> stage = TlsStage::Create(files_);
  ASSERT_TRUE(stage.ok()) << stage.status();
  const TlsFiles& staged = (*stage)->staged();
  EXPECT_NE(staged.cert_file, files_.cert_file);
  EXPECT_EQ(Read(staged.cert_file), good.cert);
  EXPECT_EQ(Read(staged.key_file), good.key);

  // Garbage over the certificate: refused once, counted, the staged set untouched.
  Write(files_.cert_file,
        "-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n");
  (*stage)->CheckNow();
  (*stage)->CheckNow();  // no change since: not tried (nor counted) again
  EXPECT_EQ((*stage)->counts().failed_reloads, 1u);
  EXPECT_EQ((*stage)->counts().reloads, 0u);
  EXPECT_EQ(Read(staged.cert_file), good.cert);
  EXPECT_EQ(Read(staged.key_file), good.key);

  // A certificate whose key is still the old one: refused too.
  Write(files_.cert_file, next.cert);
  (*stage)->CheckNow();
  EXPECT_EQ((*stage)->counts().failed_reloads, 2u);
  EXPECT_EQ(Read(staged.cert_file), good.cert);

  // Its key arrives: the new pair is staged.
  Write(files_.key_file, next.key);
  (*stage)->CheckNow();
  EXPECT_EQ((*stage)->counts().reloads, 1u);
  EXPECT_EQ(Read(staged.cert_file), next.cert);
  EXPECT_EQ(Read(staged.key_file), next.key);
  EXPECT_EQ(Read(staged.ca_file), ca.cert);
}

TEST_F(TlsStageTest, FilesThatDoNotCheckOutAtStartAreRefused) {
  const Pair good = MakePair(1), other = MakePair(2);
  Write(files_.cert_file, good.cert);
  Write(files_.key_file, other.key);
  Write(files_.ca_file, other.cert);
  absl::StatusOr<std::unique_ptr<TlsStage>> stage = TlsStage::Create(files_);
  EXPECT_EQ(stage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReasonOf(stage.status()), "BAD_TLS_FILES");
}

}  // namespace
}  // namespace fuselink::security
