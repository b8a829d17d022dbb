#include "common/logging.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

TEST(Logging, ClientTextWithNewlines_OneLine) {
  testing::internal::CaptureStderr();
  DDP_LOG(Warning) << "refused worker evil\n2026-01-01 00:00:00.000 I coordinator] forged\r\x1b[0m";
  const std::string out = testing::internal::GetCapturedStderr();
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.find('\n'), out.size() - 1);  // only the line's own end
  EXPECT_THAT(out, HasSubstr("evil\\n2026-01-01"));
  EXPECT_THAT(out, HasSubstr("forged\\r\\x1b[0m"));
}

TEST(Logging, HugeEntry_Cut) {
  testing::internal::CaptureStderr();
  DDP_LOG(Info) << std::string(1 << 20, 'x');
  EXPECT_LT(testing::internal::GetCapturedStderr().size(), kMaxLogLineBytes + 200);
}

}  // namespace
}  // namespace ddp
