// The handshake's MACs and the key table, without sockets.
#include "agent/fabric/handshake.h"

#include <string>

#include "absl/strings/escaping.h"
#include "agent/common/status_macros.h"
#include "agent/fabric/fabric_keys.h"
#include "gtest/gtest.h"

namespace fuselink::fabric::handshake {
namespace {

SessionKey CountingKey() {
  SessionKey key;
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(i);
  return key;
}

Transcript KnownTranscript() {
  Transcript t{.connector = "node-a", .acceptor = "node-b", .nic = 1};
  for (size_t i = 0; i < kNonceBytes; ++i) {
    t.client_nonce[i] = static_cast<uint8_t>(0x10 + i);
    t.server_nonce[i] = static_cast<uint8_t>(0x20 + i);
  }
  return t;
}

std::string Hex(const Mac& mac) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(mac.data()), mac.size()));
}

// Expected values from Python's hmac module over the documented input:
// label | u32le len | "node-a" | u32le len | "node-b" | u32le 1 | 10..1f | 20..2f.
TEST(HandshakeTest, MacsOfKnownInputs) {
  absl::StatusOr<Mac> acceptor =
      ComputeMac(CountingKey(), Side::kAcceptor, KnownTranscript());
  ASSERT_TRUE(acceptor.ok()) << acceptor.status();
  EXPECT_EQ(Hex(*acceptor),
            "724fcdedd8fdbc944eebb86867e4f5bfb3efa2b1cfe0e82ac9be849b7f56cf53");
  absl::StatusOr<Mac> connector =
      ComputeMac(CountingKey(), Side::kConnector, KnownTranscript());
  ASSERT_TRUE(connector.ok()) << connector.status();
  EXPECT_EQ(Hex(*connector),
            "68571def58d88412fe8f091ac8c6cbbbfda9e53cf3671b64e2e53edd57ddf6ee");
}

TEST(HandshakeTest, VerifiesItsOwnMac) {
  const Mac mac = *ComputeMac(CountingKey(), Side::kConnector, KnownTranscript());
  EXPECT_TRUE(VerifyMac(CountingKey(), Side::kConnector, KnownTranscript(), mac).ok());
}

void ExpectRefused(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(ReasonOf(status), kAuthReason) << status;
}

TEST(HandshakeTest, AnAcceptorHasAKeyOnlyForAConnectorItMadeOneFor) {
  FabricKeys keys;
  const SessionKey made = keys.AcceptKey("node-a");
  absl::StatusOr<SessionKey> known = AcceptorKeyFor(keys, "node-a");
  ASSERT_TRUE(known.ok()) << known.status();
  EXPECT_EQ(*known, made);
  const absl::Status unknown = AcceptorKeyFor(keys, "node-c").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnauthenticated) << unknown;
  EXPECT_EQ(ReasonOf(unknown), kAuthReason) << unknown;
  EXPECT_NE(unknown.message().find("'node-c'"), std::string::npos) << unknown;
}

TEST(HandshakeTest, WrongKeyFails) {
  const Mac mac = *ComputeMac(CountingKey(), Side::kConnector, KnownTranscript());
  SessionKey other = CountingKey();
  other[31] ^= 1;
  ExpectRefused(VerifyMac(other, Side::kConnector, KnownTranscript(), mac));
}

TEST(HandshakeTest, WrongNonceFails) {
  const Mac mac = *ComputeMac(CountingKey(), Side::kConnector, KnownTranscript());
  Transcript client = KnownTranscript();
  client.client_nonce[0] ^= 1;
  ExpectRefused(VerifyMac(CountingKey(), Side::kConnector, client, mac));
  Transcript server = KnownTranscript();
  server.server_nonce[15] ^= 0x80;
  ExpectRefused(VerifyMac(CountingKey(), Side::kConnector, server, mac));
}

TEST(HandshakeTest, TamperedNamesAndNicFail) {
  const Mac mac = *ComputeMac(CountingKey(), Side::kConnector, KnownTranscript());
  Transcript connector = KnownTranscript();
  connector.connector = "node-c";
  ExpectRefused(VerifyMac(CountingKey(), Side::kConnector, connector, mac));
  Transcript acceptor = KnownTranscript();
  acceptor.acceptor = "node-c";
  ExpectRefused(VerifyMac(CountingKey(), Side::kConnector, acceptor, mac));
  Transcript nic = KnownTranscript();
  nic.nic = 2;
  ExpectRefused(VerifyMac(CountingKey(), Side::kConnector, nic, mac));
}

// The length prefixes keep "ab" + "c" apart from "a" + "bc".
TEST(HandshakeTest, NameBoundariesAreUnambiguous) {
  Transcript one = KnownTranscript();
  one.connector = "ab";
  one.acceptor = "c";
  Transcript two = KnownTranscript();
  two.connector = "a";
  two.acceptor = "bc";
  EXPECT_NE(*ComputeMac(CountingKey(), Side::kAcceptor, one),
            *ComputeMac(CountingKey(), Side::kAcceptor, two));
}

// A connector cannot answer with the acceptor's MAC reflected back.
TEST(HandshakeTest, SidesAreSeparated) {
  const Mac mac_a = *ComputeMac(CountingKey(), Side::kAcceptor, KnownTranscript());
  ExpectRefused(VerifyMac(CountingKey(), Side::kConnector, KnownTranscript(), mac_a));
}

// A PROOF recorded from one connection does not answer the next one's CHALLENGE,
// even when the impostor replays the same HELLO (same client nonce).
TEST(HandshakeTest, ReplayedProofFailsAgainstANewChallenge) {
  Transcript old = KnownTranscript();
  const Mac recorded = *ComputeMac(CountingKey(), Side::kConnector, old);
  Transcript fresh = old;
  fresh.server_nonce = *NewNonce();
  ASSERT_NE(fresh.server_nonce, old.server_nonce);
  ExpectRefused(VerifyMac(CountingKey(), Side::kConnector, fresh, recorded));
}

TEST(HandshakeTest, RejectsNamesOutOfBounds) {
  Transcript empty = KnownTranscript();
  empty.connector = "";
  EXPECT_EQ(ComputeMac(CountingKey(), Side::kAcceptor, empty).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string long_name(kMaxNameBytes + 1, 'x');
  Transcript too_long = KnownTranscript();
  too_long.acceptor = long_name;
  EXPECT_EQ(ComputeMac(CountingKey(), Side::kAcceptor, too_long).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HandshakeTest, NoncesDiffer) { EXPECT_NE(*NewNonce(), *NewNonce()); }

TEST(FabricKeysTest, AcceptKeyIsMadeOnceAndForgotten) {
  FabricKeys keys;
  EXPECT_FALSE(keys.FindAcceptKey("b").has_value());
  const SessionKey first = keys.AcceptKey("b");
  EXPECT_EQ(keys.AcceptKey("b"), first);
  EXPECT_EQ(keys.FindAcceptKey("b"), first);
  EXPECT_NE(keys.AcceptKey("c"), first);               // one key per peer
  EXPECT_FALSE(keys.FindConnectKey("b").has_value());  // directional
  keys.Forget("b");
  EXPECT_FALSE(keys.FindAcceptKey("b").has_value());
  EXPECT_NE(keys.AcceptKey("b"), first);  // a fresh one after Forget
}

TEST(FabricKeysTest, ConnectKeyIsReplaced) {
  FabricKeys keys;
  const SessionKey one = *RandomKey();
  const SessionKey two = *RandomKey();
  keys.SetConnectKey("b", one);
  EXPECT_EQ(keys.FindConnectKey("b"), one);
  keys.SetConnectKey("b", two);
  EXPECT_EQ(keys.FindConnectKey("b"), two);
  EXPECT_FALSE(keys.FindAcceptKey("b").has_value());
  keys.Forget("b");
  EXPECT_FALSE(keys.FindConnectKey("b").has_value());
}

}  // namespace
}  // namespace fuselink::fabric::handshake
