#include "common/quote.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(Quote, ShortPrintable_QuotedAsIs) { EXPECT_EQ(Quote("cpu:0"), "\"cpu:0\""); }

TEST(Quote, ControlCharactersAndQuotes_Escaped) {
  EXPECT_EQ(Quote("a\nb\"c\\d\x1b"), R"("a\nb\"c\\d\x1b")");
  EXPECT_EQ(Quote("\xc3\xa9"), R"("\xc3\xa9")");  // one line, plain ASCII
}

TEST(Quote, Long_CutWithItsLength) {
  const std::string q = Quote(std::string(2500000, 'h'));
  EXPECT_EQ(q, "\"" + std::string(kMaxQuotedBytes, 'h') + "...\" (2500000 bytes)");
}

TEST(EscapeControl, ForgedLogLine_StaysOneLine) {
  const std::string host = "evil\n2026-01-01 00:00:00.000 I coordinator] job cancelled\r\x1b[2J";
  const std::string escaped = EscapeControl(host);
  EXPECT_THAT(escaped, Not(HasSubstr("\n")));
  EXPECT_THAT(escaped, Not(HasSubstr("\r")));
  EXPECT_THAT(escaped, Not(HasSubstr("\x1b")));
  EXPECT_EQ(escaped, "evil\\n2026-01-01 00:00:00.000 I coordinator] job cancelled\\r\\x1b[2J");
  EXPECT_EQ(EscapeControl("caf\xc3\xa9 a\\b"), "caf\xc3\xa9 a\\b");
}

TEST(Truncated, CutsAtACharacterBoundary) {
  EXPECT_EQ(Truncated("short", 10), "short");
  EXPECT_EQ(Truncated(std::string(2000, 'd'), 1024), std::string(1021, 'd') + "...");
  // "é" is two bytes: never cut in half.
  const std::string accents = "\xc3\xa9\xc3\xa9\xc3\xa9";
  EXPECT_EQ(Truncated(accents, 6), accents);
  EXPECT_EQ(Truncated(accents, 5), "\xc3\xa9...");
}

TEST(Bounded, ShortText_Unchanged) { EXPECT_EQ(Bounded("model.pt"), "model.pt"); }

TEST(Bounded, ControlCharacters_Escaped) {
  EXPECT_EQ(Bounded("a\nb\x01"
                    "c\x7f"),
            "a\\nb\\x01c\\x7f");
}

TEST(Bounded, LongText_CutAndSized) {
  EXPECT_EQ(Bounded(std::string(500, 'x'), 10), "xxxxxxxxxx... (500 bytes)");
}

TEST(Bounded, CutInsideACharacter_BacksOffToItsStart) {
  // "é" is two bytes; a cut after 2 bytes would split the second one.
  EXPECT_EQ(Bounded("aéé", 4), "aé... (5 bytes)");
}

}  // namespace
}  // namespace ddp
