#include "agent/fabric/wire.h"

#include <cstring>
#include <string>
#include <variant>

#include "gtest/gtest.h"

namespace fuselink::fabric::wire {
namespace {

constexpr uint32_t kMaxWrite = 1 << 20;
constexpr handshake::Nonce kNonce = {1, 2,  3,  4,  5,  6,  7,  8,
                                     9, 10, 11, 12, 13, 14, 15, 16};

HeaderBytes HeaderOf(const std::string& frame) {
  HeaderBytes header;
  std::memcpy(header.data(), frame.data(), header.size());
  return header;
}

absl::StatusCode DecodeCode(const HeaderBytes& header) {
  return DecodeHeader(header, kMaxWrite).status().code();
}

TEST(WireTest, HelloRoundTrips) {
  absl::StatusOr<std::string> frame = EncodeHello(3, "node-a", kNonce);
  ASSERT_TRUE(frame.ok()) << frame.status();
  ASSERT_EQ(frame->size(), kHeaderBytes + 6);
  EXPECT_EQ(frame->substr(kHeaderBytes), "node-a");
  absl::StatusOr<Header> decoded = DecodeHeader(HeaderOf(*frame), kMaxWrite);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto& hello = std::get<HelloHeader>(*decoded);
  EXPECT_EQ(hello.nic, 3u);
  EXPECT_EQ(hello.name_bytes, 6u);
  EXPECT_EQ(hello.client_nonce, kNonce);
}

TEST(WireTest, ChallengeRoundTrips) {
  handshake::Mac mac;
  for (size_t i = 0; i < mac.size(); ++i) mac[i] = static_cast<uint8_t>(0xC0 + i);
  const std::string frame = EncodeChallenge(kNonce, mac);
  ASSERT_EQ(frame.size(), kHeaderBytes + handshake::kMacBytes);
  EXPECT_EQ(std::memcmp(frame.data() + kHeaderBytes, mac.data(), mac.size()), 0);
  absl::StatusOr<Header> decoded = DecodeHeader(HeaderOf(frame), kMaxWrite);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(std::get<ChallengeHeader>(*decoded).server_nonce, kNonce);
}

TEST(WireTest, ProofRoundTrips) {
  handshake::Mac mac;
  mac.fill(0x5A);
  const std::string frame = EncodeProof(mac);
  ASSERT_EQ(frame.size(), kHeaderBytes + handshake::kMacBytes);
  EXPECT_EQ(std::memcmp(frame.data() + kHeaderBytes, mac.data(), mac.size()), 0);
  absl::StatusOr<Header> decoded = DecodeHeader(HeaderOf(frame), kMaxWrite);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(std::holds_alternative<ProofHeader>(*decoded));
}

TEST(WireTest, RejectsChallengeAndProofWithUnusedFieldsSet) {
  const handshake::Mac mac{};
  for (size_t at : {size_t{8}, size_t{12}, size_t{16}}) {
    HeaderBytes challenge = HeaderOf(EncodeChallenge(kNonce, mac));
    challenge[at] = 1;
    EXPECT_EQ(DecodeCode(challenge), absl::StatusCode::kInvalidArgument) << at;
  }
  for (size_t at : {size_t{8}, size_t{12}, size_t{16}, size_t{24}, size_t{32}}) {
    HeaderBytes proof = HeaderOf(EncodeProof(mac));
    proof[at] = 1;
    EXPECT_EQ(DecodeCode(proof), absl::StatusCode::kInvalidArgument) << at;
  }
}

TEST(WireTest, RejectsVersionTwo) {
  HeaderBytes hello = HeaderOf(*EncodeHello(0, "a", kNonce));
  hello[4] = 2;  // a peer from before authentication
  EXPECT_EQ(DecodeCode(hello), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, WriteRoundTrips) {
  const WriteHeader write{.key = 0xdeadbeef,
                          .offset = 0x0123456789abcdefULL,
                          .bytes = kMaxWrite,
                          .imm = 0xfeedface,
                          .wr_id = 0xfedcba9876543210ULL};
  HeaderBytes header = EncodeWrite(write);
  EXPECT_EQ(header[0], 'F');  // little-endian magic spells FLNK
  EXPECT_EQ(header[3], 'K');
  absl::StatusOr<Header> decoded = DecodeHeader(header, kMaxWrite);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto& got = std::get<WriteHeader>(*decoded);
  EXPECT_EQ(got.key, write.key);
  EXPECT_EQ(got.offset, write.offset);
  EXPECT_EQ(got.bytes, write.bytes);
  EXPECT_EQ(got.imm, write.imm);
  EXPECT_EQ(got.wr_id, write.wr_id);
}

TEST(WireTest, NotificationWriteHasNoBytes) {
  absl::StatusOr<Header> decoded =
      DecodeHeader(EncodeWrite({.key = 0, .imm = 7, .wr_id = 1}), kMaxWrite);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(std::get<WriteHeader>(*decoded).bytes, 0u);
  EXPECT_EQ(std::get<WriteHeader>(*decoded).imm, 7u);
}

TEST(WireTest, AckRoundTrips) {
  for (Refusal refusal : {Refusal::kNone, Refusal::kNoWindow, Refusal::kNotYourWindow,
                          Refusal::kOutsideWindow}) {
    const absl::StatusCode code = RefusalStatus(refusal).code();
    absl::StatusOr<Header> decoded = DecodeHeader(
        EncodeAck({.wr_id = 42, .code = code, .refusal = refusal}), kMaxWrite);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(std::get<AckFrame>(*decoded).wr_id, 42u);
    EXPECT_EQ(std::get<AckFrame>(*decoded).code, code);
    EXPECT_EQ(std::get<AckFrame>(*decoded).refusal, refusal);
  }
}

TEST(WireTest, RejectsAckWhoseRefusalAndCodeDisagree) {
  EXPECT_EQ(DecodeCode(EncodeAck({.wr_id = 1, .code = absl::StatusCode::kOutOfRange})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeCode(EncodeAck({.wr_id = 1, .refusal = Refusal::kNoWindow})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeCode(EncodeAck({.wr_id = 1,
                                  .code = absl::StatusCode::kNotFound,
                                  .refusal = static_cast<Refusal>(kMaxRefusal + 1)})),
            absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, RefuseRoundTrips) {
  absl::StatusOr<Header> decoded =
      DecodeHeader(EncodeRefuse({.why = ConnectionRefusal::kPeerConnections}), kMaxWrite);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(std::get<RefuseHeader>(*decoded).why, ConnectionRefusal::kPeerConnections);
}

TEST(WireTest, RejectsRefuseForNoKnownReasonOrWithUnusedFieldsSet) {
  for (uint32_t why : {0u, kMaxConnectionRefusal + 1}) {
    EXPECT_EQ(DecodeCode(EncodeRefuse({.why = static_cast<ConnectionRefusal>(why)})),
              absl::StatusCode::kInvalidArgument)
        << why;
  }
  for (size_t at : {12, 16, 24, 32}) {  // word1, word2, dword0, dword1
    HeaderBytes refuse = EncodeRefuse({});
    refuse[at] = 1;
    EXPECT_EQ(DecodeCode(refuse), absl::StatusCode::kInvalidArgument) << at;
  }
}

TEST(WireTest, RejectsBadMagic) {
  HeaderBytes header = EncodeAck({.wr_id = 1});
  header[0] ^= 0xff;
  EXPECT_EQ(DecodeCode(header), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, RejectsOtherVersion) {
  HeaderBytes header = EncodeAck({.wr_id = 1});
  header[4] = kProtocolVersion + 1;
  EXPECT_EQ(DecodeCode(header), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, RejectsUnknownType) {
  for (uint8_t type : {0, 6, 0xff}) {
    HeaderBytes header = EncodeAck({.wr_id = 1});
    header[6] = type;
    EXPECT_EQ(DecodeCode(header), absl::StatusCode::kInvalidArgument) << int{type};
  }
}

TEST(WireTest, RejectsReservedField) {
  HeaderBytes header = EncodeWrite({.key = 1, .bytes = 8});
  header[20] = 1;
  EXPECT_EQ(DecodeCode(header), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, RejectsWriteOverMaxBytes) {
  EXPECT_TRUE(DecodeHeader(EncodeWrite({.key = 1, .bytes = kMaxWrite}), kMaxWrite).ok());
  EXPECT_EQ(DecodeCode(EncodeWrite({.key = 1, .bytes = kMaxWrite + 1})),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeCode(EncodeWrite({.key = 1, .bytes = UINT32_MAX})),
            absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, RejectsHelloNameLengthOutOfBounds) {
  HeaderBytes header = HeaderOf(*EncodeHello(0, "a", kNonce));
  header[12] = 0;  // name bytes = 0
  EXPECT_EQ(DecodeCode(header), absl::StatusCode::kInvalidArgument);
  header[12] = 0;
  header[13] = 1;  // name bytes = 256
  EXPECT_EQ(DecodeCode(header), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, RejectsHelloNicOutOfBounds) {
  HeaderBytes header = HeaderOf(*EncodeHello(0, "a", kNonce));
  header[8] = kMaxWireNics;
  EXPECT_EQ(DecodeCode(header), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, RejectsUnusedFieldsSet) {
  HeaderBytes hello = HeaderOf(*EncodeHello(0, "a", kNonce));
  hello[16] = 1;  // word2 of a HELLO
  EXPECT_EQ(DecodeCode(hello), absl::StatusCode::kInvalidArgument);
  HeaderBytes ack = EncodeAck({.wr_id = 1});
  ack[24] = 1;  // offset of an ACK
  EXPECT_EQ(DecodeCode(ack), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, RejectsUnknownAckCode) {
  HeaderBytes header = EncodeAck({.wr_id = 1});
  header[8] = 17;
  EXPECT_EQ(DecodeCode(header), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, HelloValidatesName) {
  EXPECT_EQ(EncodeHello(0, "", kNonce).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      EncodeHello(0, std::string(kMaxNodeNameBytes + 1, 'x'), kNonce).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(EncodeHello(0, std::string(kMaxNodeNameBytes, 'x'), kNonce).ok());
  EXPECT_EQ(EncodeHello(0, std::string("a\0b", 3), kNonce).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeHello(kMaxWireNics, "a", kNonce).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fuselink::fabric::wire
