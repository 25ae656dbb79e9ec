#include "services/grpc/request_utf8.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "agent/common/status_macros.h"
#include "fuselink/v1/agent.pb.h"
#include "gtest/gtest.h"

namespace fuselink::services {
namespace {

// Wire-format pieces, written by hand so that a test can say exactly what the bytes
// hold, bad UTF-8 included (protobuf's own serializer would complain).
std::string Varint(uint64_t v) {
  std::string out;
  do {
    out += static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v != 0);
  return out;
}
std::string Tag(uint32_t field, uint32_t wire) { return Varint(field << 3 | wire); }
std::string Field(uint32_t field, const std::string& bytes) {
  return Tag(field, 2) + Varint(bytes.size()) + bytes;
}

// The parser's verdict on `bytes` as a `type`, and the walk's, agree as the header
// promises: what parses walks OK, and a BAD_UTF8 walk does not parse.
template <typename Message>
absl::Status Walk(const std::string& bytes) {
  const absl::Status walked = CheckUtf8Fields(*Message::descriptor(), bytes);
  Message message;
  const bool parsed = message.ParseFromString(bytes);
  if (parsed) {
    EXPECT_TRUE(walked.ok()) << walked;
  }
  if (ReasonOf(walked) == "BAD_UTF8") {
    EXPECT_FALSE(parsed);
  }
  return walked;
}

void ExpectReason(const absl::Status& status, const std::string& reason,
                  const std::string& in_message = "") {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(ReasonOf(status), reason) << status;
  EXPECT_NE(status.message().find(in_message), absl::string_view::npos) << status;
}

TEST(IsValidUtf8, AcceptsWellFormedText) {
  for (const std::string& text : std::vector<std::string>{
           "", "kv0", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xef\xbf\xbf",
           "\xf4\x8f\xbf\xbf", std::string("a\0b", 3)}) {
    EXPECT_TRUE(IsValidUtf8(text)) << testing::PrintToString(text);
  }
}

TEST(IsValidUtf8, RefusesMalformedText) {
  for (const std::string text :
       {"\x80", "\xbf", "\xc0\x80", "\xc1\xbf", "\xe0\x80\x80", "\xe0\x9f\xbf",
        "\xed\xa0\x80", "\xed\xbf\xbf", "\xf0\x80\x80\x80", "\xf4\x90\x80\x80",
        "\xf5\x80\x80\x80", "\xf8\x88\x80\x80\x80", "\xff", "\xc3", "\xe2\x82",
        "\xf0\x9f\x98", "a\xc3(", "\xe2\x28\xa1"}) {
    EXPECT_FALSE(IsValidUtf8(text)) << testing::PrintToString(text);
  }
}

// protobuf's parser is the reference: a string field parses exactly when the text is
// UTF-8. Every string of one and two bytes, and a spread of longer ones.
TEST(IsValidUtf8, AgreesWithTheParser) {
  auto agree = [](const std::string& text) {
    v1::GetTensorRequest request;
    const bool parsed = request.ParseFromString(Field(1, text));
    ASSERT_EQ(IsValidUtf8(text), parsed) << testing::PrintToString(text);
  };
  for (int a = 0; a < 256; ++a) {
    agree(std::string(1, static_cast<char>(a)));
    for (int b = 0; b < 256; ++b) agree({static_cast<char>(a), static_cast<char>(b)});
  }
  std::mt19937 random(3);
  for (int i = 0; i < 200000; ++i) {
    std::string text(3 + random() % 3, '\0');
    for (char& c : text) c = static_cast<char>(0x80 + random() % 0x80);
    text[0] = static_cast<char>(0xe0 + random() % 0x20);  // lead bytes of 3 and 4
    agree(text);
  }
}

TEST(CheckUtf8Fields, AWellFormedRequestIsFine) {
  v1::TransferRequest request;
  request.set_request_id("r-\xc3\xa9");
  request.mutable_source()->set_node("node-a");
  request.mutable_source()->set_tensor("kv");
  request.mutable_source()->add_block_ids(3);
  request.mutable_target()->set_node("node-b");
  request.mutable_deadline()->set_seconds(5);
  EXPECT_TRUE(Walk<v1::TransferRequest>(request.SerializeAsString()).ok());
  EXPECT_TRUE(Walk<v1::TransferRequest>("").ok());
}

TEST(CheckUtf8Fields, NamesTheFieldThatIsNotUtf8) {
  ExpectReason(Walk<v1::TransferRequest>(Field(1, "r\xff")), "BAD_UTF8",
               "fuselink.v1.TransferRequest.request_id");
  // Nested: source.tensor, after good fields.
  const std::string source = Field(1, "node-a") + Field(2, "kv\xc0\x80");
  ExpectReason(Walk<v1::TransferRequest>(Field(1, "r") + Field(2, source)), "BAD_UTF8",
               "fuselink.v1.BlockSet.tensor");
  // Every occurrence of a repeated or repeated-once field counts.
  ExpectReason(Walk<v1::GetTensorRequest>(Field(1, "ok") + Field(1, "\xed\xa0\x80")),
               "BAD_UTF8", "fuselink.v1.GetTensorRequest.name");
  // The message does not echo the bytes.
  const absl::Status status = Walk<v1::GetTensorRequest>(Field(1, "secret\xff"));
  EXPECT_EQ(status.message().find("secret"), absl::string_view::npos) << status;
}

TEST(CheckUtf8Fields, SkipsWhatTheParserDoesNotCheck) {
  // Any bytes in a bytes field (cuda_ipc.handle), in an unknown field, and in a known
  // string field sent with another wire type (the parser keeps it as unknown).
  const std::string ipc = Field(1, "\xff\xfe\xfd");
  const std::string memory = Field(2, ipc);
  EXPECT_TRUE(Walk<v1::RegisterTensorRequest>(Field(1, "kv") + Field(3, memory)).ok());
  EXPECT_TRUE(Walk<v1::GetTensorRequest>(Field(9, "\xff")).ok());
  EXPECT_TRUE(Walk<v1::GetTensorRequest>(Tag(1, 0) + Varint(300)).ok());
  EXPECT_TRUE(Walk<v1::GetTensorRequest>(Tag(1, 1) + std::string(8, '\xff')).ok());
  EXPECT_TRUE(Walk<v1::GetTensorRequest>(Tag(1, 5) + std::string(4, '\xff')).ok());
  // An unknown group, nested, with bad UTF-8 inside: skipped whole.
  const std::string group =
      Tag(7, 3) + Field(1, "\xff") + Tag(8, 3) + Tag(8, 4) + Tag(7, 4) + Field(1, "kv");
  EXPECT_TRUE(Walk<v1::GetTensorRequest>(group).ok());
}

TEST(CheckUtf8Fields, RefusesBytesThatAreNoMessage) {
  const std::string good = Field(1, "kv");
  for (const std::string& bytes :
       std::vector<std::string>{good.substr(0, good.size() - 1),  // truncated string
                                Tag(1, 2) + Varint(1u << 31),     // length past 2 GiB
                                std::string("\xff\xff\xff"),      // a truncated tag
                                Tag(0, 0) + Varint(1),            // field number 0
                                Tag(2, 6), Tag(2, 7),  // wire types that do not exist
                                Tag(3, 3) + Field(1, "x"),  // a group that never ends
                                Tag(3, 4),                  // an end with no group
                                Tag(3, 3) + Tag(4, 4),      // the wrong end
                                Tag(2, 0) + "\x80",         // a truncated varint
                                Tag(2, 1) + "1234", Tag(2, 5) + "12"}) {
    ExpectReason(Walk<v1::GetTensorRequest>(bytes), "MALFORMED_REQUEST");
  }
  // A nested message that claims more bytes than there are.
  ExpectReason(Walk<v1::TransferRequest>(Tag(2, 2) + Varint(10) + Field(1, "a")),
               "MALFORMED_REQUEST");
  // Groups nested past protobuf's recursion limit.
  std::string deep;
  for (int i = 0; i < 101; ++i) deep += Tag(5, 3);
  for (int i = 0; i < 101; ++i) deep += Tag(5, 4);
  ExpectReason(Walk<v1::GetTensorRequest>(deep), "MALFORMED_REQUEST", "deeply");
}

}  // namespace
}  // namespace fuselink::services
