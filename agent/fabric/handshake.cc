#include "agent/fabric/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/little_endian.h"

namespace fuselink::fabric::handshake {
namespace {

static_assert(kMacBytes == 32, "HMAC-SHA256 makes 32 bytes");
static_assert(kNonceBytes >= 16, "nonces of 128 bits do not repeat by chance");
static_assert(kMaxNameBytes <= UINT32_MAX, "a name length is a u32 in the MAC input");

void AppendU32(std::string& out, uint32_t value) {
  std::array<uint8_t, sizeof(uint32_t)> bytes;
  PutLe<uint32_t>(bytes, 0, value);
  out.append(bytes.begin(), bytes.end());
}

absl::Status CheckName(absl::string_view role, absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", role, " name must be 1..", kMaxNameBytes, " bytes, is ", name.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Nonce> NewNonce() {
  Nonce nonce;
  FL_RETURN_IF_ERROR(FillRandom(nonce));
  return nonce;
}

absl::StatusOr<SessionKey> AcceptorKeyFor(const FabricKeys& keys,
                                          absl::string_view connector) {
  std::optional<SessionKey> key = keys.FindAcceptKey(connector);
  if (!key.has_value()) {
    return WithReason(absl::UnauthenticatedError(
                          absl::StrCat("HELLO from '", BoundedForMessage(connector),
                                       "', which holds no fabric key for this node")),
                      kAuthReason);
  }
  return *std::move(key);
}

absl::StatusOr<Mac> ComputeMac(const SessionKey& key, Side side,
                               const Transcript& transcript) {
  FL_RETURN_IF_ERROR(CheckName("connector", transcript.connector));
  FL_RETURN_IF_ERROR(CheckName("acceptor", transcript.acceptor));
  const absl::string_view label =
      side == Side::kAcceptor ? kAcceptorLabel : kConnectorLabel;
  std::string input;
  input.reserve(label.size() + 2 * (sizeof(uint32_t) + kMaxNameBytes) + sizeof(uint32_t) +
                2 * kNonceBytes);
  input.append(label.data(), label.size());
  AppendU32(input, static_cast<uint32_t>(transcript.connector.size()));
  input.append(transcript.connector.data(), transcript.connector.size());
  AppendU32(input, static_cast<uint32_t>(transcript.acceptor.size()));
  input.append(transcript.acceptor.data(), transcript.acceptor.size());
  AppendU32(input, transcript.nic);
  input.append(transcript.client_nonce.begin(), transcript.client_nonce.end());
  input.append(transcript.server_nonce.begin(), transcript.server_nonce.end());

  Mac mac;
  unsigned int mac_bytes = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac.data(),
           &mac_bytes) == nullptr ||
      mac_bytes != kMacBytes) {
    return absl::InternalError("HMAC-SHA256 failed in libcrypto");
  }
  return mac;
}

absl::Status VerifyMac(const SessionKey& key, Side side, const Transcript& transcript,
                       const Mac& mac) {
  FL_ASSIGN_OR_RETURN(const Mac expected, ComputeMac(key, side, transcript));
  if (CRYPTO_memcmp(expected.data(), mac.data(), kMacBytes) != 0) {
    return WithReason(absl::UnavailableError(absl::StrCat(
                          "the ", side == Side::kAcceptor ? "acceptor" : "connector",
                          " did not prove the fabric key agreed for this pair of nodes")),
                      kAuthReason);
  }
  return absl::OkStatus();
}

}  // namespace fuselink::fabric::handshake
