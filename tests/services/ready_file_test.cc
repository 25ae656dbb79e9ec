// The ready file: a JSON line whose strings are escaped, read back by the clients'
// ReadyField whatever the values hold.
#include "services/ready_file.h"

#include <fstream>
#include <sstream>

#include "agent/common/json.h"
#include "clients/cpp/client.h"
#include "gtest/gtest.h"

namespace fuselink::services {
namespace {

TEST(ReadyFileTest, PlainValuesAreOneCompactLine) {
  const ReadyInfo info{.node = "node-a",
                       .grpc_address = "127.0.0.1:5000",
                       .metrics_url = "http://127.0.0.1:9000/metrics",
                       .handle_socket = "/run/fuselink/node-a.sock"};
  EXPECT_EQ(ReadyJson(info),
            "{\"node\":\"node-a\",\"grpc\":\"127.0.0.1:5000\","
            "\"metrics\":\"http://127.0.0.1:9000/metrics\","
            "\"handle_socket\":\"/run/fuselink/node-a.sock\"}\n");
}

TEST(ReadyFileTest, QuotesBackslashesAndControlsAreEscaped) {
  EXPECT_EQ(JsonQuoted("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonQuoted("l1\nl2\t\r"), "\"l1\\nl2\\t\\r\"");
  EXPECT_EQ(JsonQuoted(std::string("\x01\x1f", 2)), "\"\\u0001\\u001f\"");
  EXPECT_EQ(JsonQuoted("gr\xc3\xbc\xc3\x9f"), "\"gr\xc3\xbc\xc3\x9f\"");  // UTF-8 as is
}

// A value that would have broken the hand-built line (a quote, a key inside it) reads
// back whole, and the other keys are still found.
TEST(ReadyFileTest, EveryValueReadsBack) {
  const ReadyInfo info{.node = "n\"ode",
                       .grpc_address = "[::1]:5000",
                       .metrics_url = "https://h:1/metrics",
                       .handle_socket = "/tmp/a \"grpc\":\"x\\y\n.sock"};
  const std::string json = ReadyJson(info);
  EXPECT_EQ(client::ReadyField(json, "node"), info.node);
  EXPECT_EQ(client::ReadyField(json, "grpc"), info.grpc_address);
  EXPECT_EQ(client::ReadyField(json, "metrics"), info.metrics_url);
  EXPECT_EQ(client::ReadyField(json, "handle_socket"), info.handle_socket);
  EXPECT_EQ(client::ReadyField(json, "absent"), "");
  EXPECT_EQ(client::ReadyField("{\"grpc\":\"unterminated", "grpc"), "");
  EXPECT_EQ(client::ReadyField("{\"k\":\"\\u00fc\\/\"}", "k"), "\xc3\xbc/");
}

TEST(ReadyFileTest, WrittenWholeAndRenamedIntoPlace) {
  const std::string path = ::testing::TempDir() + "/ready_file_test.json";
  const ReadyInfo info{.node = "node-a",
                       .grpc_address = "h:1",
                       .metrics_url = "http://h:2/metrics",
                       .handle_socket = "/s"};
  ASSERT_TRUE(WriteReadyFile(path, info).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), ReadyJson(info));
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
  const absl::Status missing = WriteReadyFile("/nonexistent-dir/ready.json", info);
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace fuselink::services
