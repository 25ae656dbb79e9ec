#include "agent/common/status_macros.h"

#include <random>
#include <string>

#include "gtest/gtest.h"

namespace fuselink {
namespace {

// Every byte as BoundedForMessage writes it, uncut.
std::string Escaped(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
  }
  return out;
}

TEST(BoundedForMessage, ShortPrintableTextIsUnchanged) {
  EXPECT_EQ(BoundedForMessage(""), "");
  EXPECT_EQ(BoundedForMessage("node-b/kv0"), "node-b/kv0");
  const std::string exactly(kMaxEchoBytes, 'k');
  EXPECT_EQ(BoundedForMessage(exactly), exactly);
}

TEST(BoundedForMessage, LongTextIsCutWithAMarker) {
  const std::string one_more(kMaxEchoBytes + 1, 'k');
  EXPECT_EQ(BoundedForMessage(one_more), std::string(kMaxEchoBytes - 3, 'k') + "...");
  const std::string megabyte(1 << 20, 'k');
  EXPECT_EQ(BoundedForMessage(megabyte), std::string(kMaxEchoBytes - 3, 'k') + "...");
}

TEST(BoundedForMessage, BytesOutsidePrintableAsciiAreEscaped) {
  EXPECT_EQ(BoundedForMessage("a\xff\n\\b"), "a\\xff\\x0a\\x5cb");
  EXPECT_EQ(BoundedForMessage(std::string("\0", 1)), "\\x00");
  // An escape is never split by the cut.
  const std::string text = std::string(kMaxEchoBytes - 5, 'a') + "\xc3\xa9";
  EXPECT_EQ(BoundedForMessage(text), std::string(kMaxEchoBytes - 5, 'a') + "...");
}

TEST(BoundedForMessage, AnyBytesGiveBoundedPrintableText) {
  std::mt19937 random(7);
  for (int round = 0; round < 2000; ++round) {
    std::string text(random() % 100, '\0');
    for (char& c : text)
      c = static_cast<char>(random() % 4 == 0 ? random() : 'a' + random() % 26);
    const std::string out = BoundedForMessage(text);
    ASSERT_LE(out.size(), kMaxEchoBytes) << out;
    for (char c : out) ASSERT_TRUE(c >= 0x20 && c < 0x7f) << out;
    const std::string full = Escaped(text);
    if (full.size() <= kMaxEchoBytes) {
      EXPECT_EQ(out, full);
    } else {
      ASSERT_GE(out.size(), 3u);
      EXPECT_EQ(out.substr(out.size() - 3), "...");
      const std::string kept = out.substr(0, out.size() - 3);
      EXPECT_EQ(full.compare(0, kept.size(), kept), 0) << out;
      // As much as fits: the next byte of the text, as written, would not.
      const size_t next = full[kept.size()] == '\\' ? 4 : 1;
      EXPECT_GT(kept.size() + next, kMaxEchoBytes - 3) << out;
    }
  }
}

}  // namespace
}  // namespace fuselink
