#include "common/status_line.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using testing::HasSubstr;
using testing::Not;

TEST(StatusLine, RoundTrip_KeepsCodeAndMessage) {
  const absl::Status s = absl::InvalidArgumentError("model.path: \"/a b\" does not exist");
  EXPECT_EQ(EncodeStatusLine(s), "3 model.path: \"/a b\" does not exist\n");
  EXPECT_EQ(*DecodeStatusLine(EncodeStatusLine(s)), s);
  EXPECT_EQ(*DecodeStatusLine(EncodeStatusLine(absl::OkStatus())), absl::OkStatus());
}

TEST(StatusLine, MultiLineOrHugeMessage_StillOneBoundedLine) {
  const std::string line =
      EncodeStatusLine(absl::InternalError("one\ntwo\n" + std::string(100000, 'x')));
  EXPECT_LE(line.size(), kMaxStatusLine);
  auto decoded = DecodeStatusLine(line);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_THAT(*decoded, StatusIs(absl::StatusCode::kInternal, HasSubstr("one\\ntwo")));
}

TEST(StatusLine, Decode_Nonsense_Refused) {
  for (const char* bad :
       {"", "3 no newline", "x message\n", "99 message\n", "-1 m\n", "3 two\nlines\n", "3\n"}) {
    EXPECT_FALSE(DecodeStatusLine(bad).has_value()) << bad;
  }
}

TEST(StatusLine, Decode_ControlCharactersFromTheHelper_Escaped) {
  auto decoded = DecodeStatusLine("3 forged\rline\x1b[31m\n");
  ASSERT_TRUE(decoded.has_value());
  EXPECT_THAT(std::string(decoded->message()), Not(HasSubstr("\r")));
}

}  // namespace
}  // namespace ddp
