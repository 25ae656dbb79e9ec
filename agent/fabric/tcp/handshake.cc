#include "agent/fabric/tcp/handshake.h"

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

absl::Status Send(int fd, const void* frame, size_t bytes) {
  iovec iov[1] = {{const_cast<void*>(frame), bytes}};
  return SendAll(fd, iov);
}

absl::Status Send(int fd, const std::string& frame) {
  return Send(fd, frame.data(), frame.size());
}

absl::Status Malformed(const absl::Status& why) {
  return WithReason(absl::InvalidArgumentError(
                        absl::StrCat("closed on a malformed frame: ", why.message())),
                    kMalformedReason);
}

// Reads one header before `deadline` and decodes it.
absl::StatusOr<wire::Header> ReadFrame(int fd, uint32_t max_write_bytes,
                                       absl::Time deadline) {
  wire::HeaderBytes header;
  FL_RETURN_IF_ERROR(RecvBefore(fd, header.data(), header.size(), deadline));
  absl::StatusOr<wire::Header> decoded = wire::DecodeHeader(header, max_write_bytes);
  if (!decoded.ok()) return Malformed(decoded.status());
  return decoded;
}

// `frame` as a T, or malformed.
template <typename T>
absl::StatusOr<T> As(const wire::Header& frame, absl::string_view expected) {
  const T* as = std::get_if<T>(&frame);
  if (as == nullptr) {
    return Malformed(absl::InvalidArgumentError(absl::StrCat("expected ", expected)));
  }
  return *as;
}

template <typename T>
absl::StatusOr<T> ReadHeader(int fd, uint32_t max_write_bytes, absl::Time deadline,
                             absl::string_view expected) {
  FL_ASSIGN_OR_RETURN(const wire::Header frame, ReadFrame(fd, max_write_bytes, deadline));
  return As<T>(frame, expected);
}

// The acceptor's answer to HELLO: its CHALLENGE, or the status its REFUSE stands for.
absl::StatusOr<wire::ChallengeHeader> ReadChallenge(int fd, absl::Time deadline) {
  FL_ASSIGN_OR_RETURN(const wire::Header frame,
                      ReadFrame(fd, /*max_write_bytes=*/0, deadline));
  if (const auto* refuse = std::get_if<wire::RefuseHeader>(&frame)) {
    return RefusedByAcceptor(refuse->why);
  }
  return As<wire::ChallengeHeader>(frame, "a CHALLENGE");
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
  // Connect, UNAVAILABLE, as its silence would; its REFUSE says why.
  absl::StatusOr<wire::ChallengeHeader> challenge = ReadChallenge(fd, deadline);
  if (!challenge.ok()) {
    if (challenge.status().code() == absl::StatusCode::kDeadlineExceeded ||
        ReasonOf(challenge.status()) == kPeerConnectionsReason) {
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
  if (absl::Status admitted = admit(name); !admitted.ok()) {
    return RefuseConnector(fd, std::move(admitted));
  }
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

absl::Status RefusedByAcceptor(wire::ConnectionRefusal why) {
  switch (why) {
    case wire::ConnectionRefusal::kPeerConnections:
      return WithReason(
          absl::ResourceExhaustedError(
              "the acceptor refused the connection: this node holds its share of "
              "connections there (its --fabric_connections_per_peer)"),
          kPeerConnectionsReason);
  }
  // DecodeHeader takes no other.
  return absl::InternalError(
      absl::StrCat("REFUSE for reason ", static_cast<uint32_t>(why)));
}

absl::Status RefuseConnector(int fd, absl::Status why) {
  if (ReasonOf(why) == kPeerConnectionsReason) {
    // The connection closes after this whether or not the REFUSE went out.
    const wire::HeaderBytes refuse =
        wire::EncodeRefuse({.why = wire::ConnectionRefusal::kPeerConnections});
    Send(fd, refuse.data(), refuse.size()).IgnoreError();
  }
  return why;
}

}  // namespace fuselink::fabric
