// The web-config parser (services/metrics/http/web_config.h and strict_yaml.h): what a
// good file means, and for each bad input the error, which names the line.
#include "services/metrics/http/web_config.h"

#include <crypt.h>

#include <string>

#include "agent/common/check.h"
#include "gtest/gtest.h"
#include "services/metrics/http/strict_yaml.h"

namespace fuselink::services::http {
namespace {

constexpr char kHash[] = "$2b$10$fuselinkdummysaltfuseuVTKzBMwShV.zJPNIomO4LT9Qh81MSLy";

TEST(WebConfig, FullFile) {
  const std::string text = std::string(R"(# the metrics endpoint
tls_server_config:
  cert_file: server.crt   # relative: to the file's folder
  key_file: "/etc/keys/server key.pem"
  client_ca_file: 'ca.crt'
  client_auth_type: RequireAndVerifyClientCert
  min_version: TLS13

basic_auth_users:
  prometheus: )") + kHash + "\n  \"other user\": '" +
                           kHash + "'\n";
  absl::StatusOr<WebConfig> config = ParseWebConfig(text, "/etc/fuselink");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->tls.has_value());
  EXPECT_EQ(config->tls->cert_file, "/etc/fuselink/server.crt");
  EXPECT_EQ(config->tls->key_file, "/etc/keys/server key.pem");
  EXPECT_EQ(config->tls->client_ca_file, "/etc/fuselink/ca.crt");
  EXPECT_EQ(config->tls->client_auth, ClientAuth::kRequireAndVerifyClientCert);
  EXPECT_TRUE(config->tls->min_tls13);
  ASSERT_EQ(config->basic_auth_users.size(), 2u);
  EXPECT_EQ(config->basic_auth_users[0].first, "prometheus");
  EXPECT_EQ(config->basic_auth_users[1].first, "other user");
  EXPECT_EQ(config->basic_auth_users[1].second, kHash);
}

TEST(WebConfig, EmptyFileIsPlainHttp) {
  for (const char* text : {"", "# nothing\n\n", "basic_auth_users:\n"}) {
    absl::StatusOr<WebConfig> config = ParseWebConfig(text, "/x");
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_FALSE(config->tls.has_value());
    EXPECT_TRUE(config->basic_auth_users.empty());
  }
}

TEST(WebConfig, CrlfTabsAfterContentAndQuotedUtf8) {
  absl::StatusOr<WebConfig> config = ParseWebConfig(
      "tls_server_config:\r\n  cert_file: \"caf\xc3\xa9.crt\"\t# a tab\r\n"
      "\r\n  key_file: b\r\n",
      "/d");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->tls->cert_file, "/d/caf\xc3\xa9.crt");
  EXPECT_EQ(config->tls->key_file, "/d/b");
}

TEST(WebConfig, TlsWithoutClientCerts) {
  absl::StatusOr<WebConfig> config =
      ParseWebConfig("tls_server_config:\n    cert_file: a\n    key_file: b\n", "/d");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->tls->client_auth, ClientAuth::kNoClientCert);
  EXPECT_FALSE(config->tls->min_tls13);
  EXPECT_TRUE(config->tls->client_ca_file.empty());
}

struct Bad {
  const char* text;
  const char* error;  // a part of the message
};

class BadWebConfig : public testing::TestWithParam<Bad> {};

TEST_P(BadWebConfig, RefusedNamingTheLine) {
  absl::StatusOr<WebConfig> config = ParseWebConfig(GetParam().text, "/d");
  ASSERT_FALSE(config.ok()) << GetParam().text;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(config.status().message().find(GetParam().error), absl::string_view::npos)
      << "got: " << config.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Each, BadWebConfig,
    testing::Values(
        // What a web config may use of YAML.
        Bad{"tls_server_config:\n  - cert_file: a\n",
            "line 2: sequences are not supported"},
        Bad{"tls_server_config: {cert_file: a}\n", "line 1: value starts with '{'"},
        Bad{"basic_auth_users: [a]\n", "line 1: value starts with '['"},
        Bad{"a: &anchor x\n", "line 1: value starts with '&'"},
        Bad{"a: *alias\n", "line 1: value starts with '*'"},
        Bad{"a: !!str x\n", "line 1: value starts with '!'"},
        Bad{"a: |\n  text\n", "line 1: value starts with '|'"},
        Bad{"a: >\n", "line 1: value starts with '>'"},
        Bad{"---\na: b\n", "line 1: document markers are not supported"},
        // YAML syntax errors, in libyaml's words.
        Bad{"a: \"open\n",
            "line 2: found unexpected end of stream (while scanning a quoted scalar "
            "from line 1)"},
        Bad{"a: 'x' y\n", "line 1: did not find expected key"},
        Bad{"a: \"\\q\"\n", "line 1: found unknown escape character"},
        Bad{"tls_server_config:\n\tcert_file: a\n", "line 2: tab in indentation"},
        Bad{"a: b\n \t\n", "line 2: tab in indentation"},
        Bad{"  a: b\n", "line 1: the first key is indented"},
        Bad{"a: b\n  c: d\n", "line 2: indented under 'a', which has a value"},
        Bad{"a: b\n  c\n", "line 2: indented under 'a', which has a value"},
        Bad{"a: \"two\n  lines\"\n", "line 1: quoted scalar not closed on its line"},
        Bad{"a: b\n...\n", "line 2: document markers are not supported"},
        Bad{"%YAML 1.1\n---\na: b\n", "line 1: directives are not supported"},
        Bad{"a: \"\xff\"\n", "line 1: invalid leading UTF-8 octet"},
        Bad{"a:\n    b: c\n  d: e\n", "line 3: did not find expected key"},
        Bad{"a:\n  b: c\n    d: e\n", "line 3: indented under 'b'"},
        Bad{"a: b\na: c\n", "line 2: duplicate key 'a'"},
        Bad{"just words\n", "line 1: expected 'key: value' or 'key:'"},
        Bad{"a: b: c\n", "line 1: mapping values are not allowed in this context"},
        Bad{"a: caf\xc3\xa9\n", "line 1: value holds a character outside printable"},
        Bad{"a: b\x01\n", "line 1: control character"},
        Bad{"\"\": x\n", "line 1: empty key"},
        Bad{"a:\n b:\n  c:\n   d:\n    e:\n     f:\n      g:\n       h:\n        i: j\n",
            "nested deeper than 8 levels"},
        // The web config's own keys.
        Bad{"tls_config:\n  cert_file: a\n", "line 1: tls_config: unknown key"},
        Bad{"tls_server_config:\n  cert_file: a\n  key: b\n", "line 3: key: unknown key"},
        Bad{"tls_server_config:\n  cert_file: a\n",
            "line 1: tls_server_config: needs both"},
        Bad{"tls_server_config: yes\n", "line 1: tls_server_config: expects a mapping"},
        Bad{"tls_server_config:\n  cert_file:\n    x: y\n  key_file: b\n",
            "line 2: cert_file: expects a value, not a mapping"},
        Bad{"tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: "
            "Maybe\n",
            "line 4: client_auth_type: unknown 'Maybe'"},
        Bad{"tls_server_config:\n  cert_file: a\n  key_file: b\n"
            "  client_auth_type: RequireAndVerifyClientCert\n",
            "line 1: tls_server_config: client_auth_type that verifies needs "
            "client_ca_file"},
        Bad{"tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS10\n",
            "line 4: min_version: unknown 'TLS10'"},
        Bad{"basic_auth_users: alice\n", "line 1: basic_auth_users: expects a mapping"},
        Bad{"basic_auth_users:\n  alice: plaintext\n",
            "line 2: alice: not a bcrypt hash"},
        Bad{"basic_auth_users:\n  alice: \"\"\n", "line 2: alice: is empty"},
        Bad{"basic_auth_users:\n  \"a:b\": $2b$10$fuselinkdummysaltfuseuVTKzBMwShV."
            "zJPNIomO4LT9Qh81MSLy\n",
            "line 2: a:b: a user name cannot hold ':'"}));

TEST(WebConfig, OversizedFileRefused) {
  absl::StatusOr<YamlNode> root = ParseStrictYaml(std::string(kMaxYamlBytes + 1, '#'));
  ASSERT_FALSE(root.ok());
  EXPECT_EQ(root.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WebConfig, LoadMissingFileIsNotFound) {
  EXPECT_EQ(LoadWebConfig("/nonexistent/web.yml").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(Bcrypt, MatchesOnlyTheRightPassword) {
  char salt[CRYPT_GENSALT_OUTPUT_SIZE];
  ASSERT_NE(crypt_gensalt_rn("$2b$", 4, nullptr, 0, salt, sizeof(salt)), nullptr);
  crypt_data data{};
  const char* hashed = crypt_r("s3cret", salt, &data);
  ASSERT_NE(hashed, nullptr);
  const std::string hash = hashed;
  EXPECT_TRUE(BcryptMatches("s3cret", hash));
  EXPECT_FALSE(BcryptMatches("s3cret ", hash));
  EXPECT_FALSE(BcryptMatches("", hash));
  EXPECT_FALSE(BcryptMatches(std::string("s3cret\0x", 8), hash));
  EXPECT_FALSE(BcryptMatches("s3cret", "not a hash"));
  EXPECT_TRUE(BcryptMatches("fuselink-unknown-user", kHash));
}

// bcrypt takes tens of milliseconds by design: on the /metrics server's poll loop it
// would hold every scrape, so it runs on fl-basic-auth, and a checking build says so.
TEST(Bcrypt, NeverRunsOnAPollLoop) {
#ifndef FUSELINK_DCHECK
  GTEST_SKIP() << "FL_MAY_BLOCK is checked in checking builds only (the sanitized ones)";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        SetThreadRole(ThreadRole::kPollLoop);
        BcryptMatches("s3cret", kHash);
      },
      "code that may block runs on a thread that must not block");
#endif
}

}  // namespace
}  // namespace fuselink::services::http
