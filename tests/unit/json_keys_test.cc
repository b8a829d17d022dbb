#include "common/json_keys.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

TEST(JsonKeys, CheckNoDuplicateKeys_DistinctKeys_Ok) {
  EXPECT_THAT(CheckNoDuplicateKeys(R"({"a": 1, "b": {"a": 2}, "c": [{"a": 1}, {"a": 2}]})"),
              IsOk());
  EXPECT_THAT(CheckNoDuplicateKeys(R"({"a": "\"a\": 1, \"a\"", "b": "}{]["})"), IsOk());
}

TEST(JsonKeys, CheckNoDuplicateKeys_Nested_NamesThePath) {
  EXPECT_THAT(CheckNoDuplicateKeys(R"({"x": {"y": {"z": 1, "z": 2}}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job.x.y.z")));
  EXPECT_THAT(CheckNoDuplicateKeys(R"({"x": [{"z": 1}, {"z": 1, "z": 2}]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job.x[].z")));
}

TEST(JsonKeys, CheckNoDuplicateKeys_EscapedSpelling_SameKey) {
  EXPECT_THAT(CheckNoDuplicateKeys(R"({"lr": 1, "l\u0072": 2})"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("job.lr")));
}

TEST(JsonKeys, CheckNoDuplicateKeys_NotJson_LeftToTheParser) {
  for (const char* text : {"", "}", "]]]", R"({"a)", R"({"a": "\)", "{{{{", "[1, 2"}) {
    EXPECT_THAT(CheckNoDuplicateKeys(text), IsOk()) << text;
  }
}

TEST(JsonKeys, CheckNoDuplicateKeys_DeepNesting_NoStackOverflow) {
  const std::string deep = std::string(1 << 20, '[') + std::string(1 << 20, ']');
  EXPECT_THAT(CheckNoDuplicateKeys(deep), IsOk());
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += R"({"k": )";
  objects += "1";
  for (int i = 0; i < 100000; ++i) objects += "}";
  EXPECT_THAT(CheckNoDuplicateKeys(objects), IsOk());
}

TEST(JsonKeys, CheckNoDuplicateKeys_HugeKey_EchoedShort) {
  const std::string key(1 << 20, 'k');
  const absl::Status s =
      CheckNoDuplicateKeys(std::string("{\"") + key + "\": 1, \"" + key + "\": 2}");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
  EXPECT_LT(s.message().size(), 1000u);
}

}  // namespace
}  // namespace ddp
