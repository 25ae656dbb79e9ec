#include "agent/fabric/tcp_handshake.h"

#include <algorithm>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/handshake.h"
#include "agent/fabric/socket.h"
#include "agent/fabric/wire.h"

namespace fuselink::fabric {
namespace {

// Every read of the handshake ends by one deadline, however the peer dribbles.
absl::Status RecvBefore(int fd, void* data, size_t bytes, absl::Time deadline) {
  return RecvAllBefore(fd, data, bytes, deadline);
}

absl::Status Send(int fd, const std::string& frame) {
  iovec iov[1] = {{const_cast<char*>(frame.data()), frame.size()}};
  return SendAll(fd, iov);
}

absl::Status Malformed(const absl::Status& why) {
  return WithReason(absl::InvalidArgumentError(
                        absl::StrCat("closed on a malformed frame: ", why.message())),
                    kMalformedReason);
}

// Reads one header before `deadline` and decodes it as a T.
template <typename T>
absl::StatusOr<T> ReadHeader(int fd, uint32_t max_write_bytes, absl::Time deadline,
                             absl::string_view expected) {
  wire::HeaderBytes header;
  FL_RETURN_IF_ERROR(RecvBefore(fd, header.data(), header.size(), deadline));
  absl::StatusOr<wire::Header> decoded = wire::DecodeHeader(header, max_write_bytes);
  if (!decoded.ok()) return Malformed(decoded.status());
  const T* frame = std::get_if<T>(&*decoded);
  if (frame == nullptr) {
    return Malformed(absl::InvalidArgumentError(absl::StrCat("expected ", expected)));
  }
  return *frame;
}

}  // namespace

absl::Status ProveToAcceptor(int fd, uint32_t nic, absl::string_view self,
                             absl::string_view acceptor, const SessionKey& key,
                             int timeout_ms) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  handshake::Transcript transcript{.connector = self, .acceptor = acceptor, .nic = nic};
  FL_ASSIGN_OR_RETURN(transcript.client_nonce, handshake::NewNonce());
  FL_ASSIGN_OR_RETURN(std::string hello,
                      wire::EncodeHello(nic, self, transcript.client_nonce));
  FL_RETURN_IF_ERROR(Send(fd, hello));

  // The acceptor's frames are checked like any peer's: its garbage fails the
  // Connect, UNAVAILABLE, as its silence would.
  absl::StatusOr<wire::ChallengeHeader> challenge = ReadHeader<wire::ChallengeHeader>(
      fd, /*max_write_bytes=*/0, deadline, "a CHALLENGE");
  if (!challenge.ok()) {
    if (challenge.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return challenge.status();
    }
    return absl::UnavailableError(absl::StrCat(
        "the acceptor did not answer HELLO with a CHALLENGE (does it hold a fabric "
        "key for this node, and room for another of its connections?): ",
        challenge.status().message()));
  }
  transcript.server_nonce = challenge->server_nonce;
  handshake::Mac mac_a;
  FL_RETURN_IF_ERROR(RecvBefore(fd, mac_a.data(), mac_a.size(), deadline));
  FL_RETURN_IF_ERROR(
      handshake::VerifyMac(key, handshake::Side::kAcceptor, transcript, mac_a));
  FL_ASSIGN_OR_RETURN(
      const handshake::Mac mac_c,
      handshake::ComputeMac(key, handshake::Side::kConnector, transcript));
  FL_RETURN_IF_ERROR(Send(fd, wire::EncodeProof(mac_c)));
  return SetReceiveTimeout(fd, 0);
}

absl::StatusOr<std::string> AuthenticateConnector(
    int fd, uint32_t nic, absl::string_view self, const FabricKeys& keys,
    uint32_t max_write_bytes, int timeout_ms,
    absl::FunctionRef<absl::Status(absl::string_view connector)> admit) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  FL_ASSIGN_OR_RETURN(
      const wire::HelloHeader hello,
      ReadHeader<wire::HelloHeader>(fd, max_write_bytes, deadline, "a HELLO"));
  if (hello.nic != nic) {
    return Malformed(absl::InvalidArgumentError(
        absl::StrCat("HELLO from NIC ", hello.nic, " on NIC ", nic)));
  }
  std::string name(hello.name_bytes, '\0');  // at most kMaxNodeNameBytes
  FL_RETURN_IF_ERROR(RecvBefore(fd, name.data(), name.size(), deadline));
  if (absl::Status valid = wire::ValidateNodeName(name); !valid.ok()) {
    return Malformed(valid);
  }
  FL_ASSIGN_OR_RETURN(const SessionKey key, handshake::AcceptorKeyFor(keys, name));
  FL_RETURN_IF_ERROR(admit(name));
  handshake::Transcript transcript{.connector = name,
                                   .acceptor = self,
                                   .nic = nic,
                                   .client_nonce = hello.client_nonce};
  FL_ASSIGN_OR_RETURN(transcript.server_nonce, handshake::NewNonce());
  FL_ASSIGN_OR_RETURN(const handshake::Mac mac_a,
                      handshake::ComputeMac(key, handshake::Side::kAcceptor, transcript));
  FL_RETURN_IF_ERROR(Send(fd, wire::EncodeChallenge(transcript.server_nonce, mac_a)));

  FL_RETURN_IF_ERROR(
      ReadHeader<wire::ProofHeader>(fd, max_write_bytes, deadline, "a PROOF").status());
  handshake::Mac mac_c;
  FL_RETURN_IF_ERROR(RecvBefore(fd, mac_c.data(), mac_c.size(), deadline));
  FL_RETURN_IF_ERROR(
      handshake::VerifyMac(key, handshake::Side::kConnector, transcript, mac_c));
  FL_RETURN_IF_ERROR(SetReceiveTimeout(fd, 0));
  return name;
}

}  // namespace fuselink::fabric
