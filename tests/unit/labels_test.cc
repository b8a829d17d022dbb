// Worker labels and job selectors: parsing, the bounds, matching.
#include "common/labels.h"

#include <string>

#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(Labels, Parse_KeyValuePairs_EmptyIsNone) {
  auto labels =
      ParseLabels("--labels", " zone=a , gpu=h200,topology.kubernetes.io/rack=r-7,empty=");
  ASSERT_THAT(labels, IsOk());
  EXPECT_EQ(
      *labels,
      (Labels{
          {"zone", "a"}, {"gpu", "h200"}, {"topology.kubernetes.io/rack", "r-7"}, {"empty", ""}}));
  EXPECT_EQ(FormatLabels(*labels), "empty=,gpu=h200,topology.kubernetes.io/rack=r-7,zone=a");
  auto none = ParseLabels("--labels", "");
  ASSERT_THAT(none, IsOk());
  EXPECT_TRUE(none->empty());
}

TEST(Labels, Parse_BadInput_InvalidArgumentNamingItAndTheForm) {
  EXPECT_THAT(ParseLabels("--labels", "zone"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--labels"), HasSubstr("\"zone\" is not key=value"))));
  EXPECT_THAT(ParseLabels("--labels", "zone=a,zone=b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("given twice")));
  EXPECT_THAT(ParseLabels("--labels", "=a"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key \"\"")));
  EXPECT_THAT(ParseLabels("--labels", "-zone=a"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("starting with a letter")));
  EXPECT_THAT(ParseLabels("--labels", "zone=a b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the value of zone")));
}

TEST(Labels, Check_Bounds) {
  Labels many;
  for (int i = 0; i <= static_cast<int>(kMaxLabels); ++i) many["k" + std::to_string(i)] = "v";
  EXPECT_THAT(CheckLabels("register.labels", many),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("register.labels"), HasSubstr("limit is 16"))));
  EXPECT_THAT(CheckLabels("x", {{std::string(64, 'k'), "v"}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CheckLabels("x", {{"k", std::string(64, 'v')}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CheckLabels("x", {{std::string(63, 'k'), std::string(63, 'v')}}), IsOk());
  // What a client sent is shown escaped, never raw.
  EXPECT_THAT(CheckLabels("x", {{"k\n", "v"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"k\\n\"")));
}

TEST(Labels, Match_EveryKeyOfTheSelectorWithItsValue) {
  const Labels worker{{"zone", "a"}, {"gpu", "h200"}};
  EXPECT_TRUE(LabelsMatch(worker, {}));
  EXPECT_TRUE(LabelsMatch(worker, {{"zone", "a"}}));
  EXPECT_TRUE(LabelsMatch(worker, {{"zone", "a"}, {"gpu", "h200"}}));
  EXPECT_FALSE(LabelsMatch(worker, {{"zone", "b"}}));
  EXPECT_FALSE(LabelsMatch(worker, {{"zone", "a"}, {"rack", "1"}}));
  EXPECT_FALSE(LabelsMatch({}, {{"zone", "a"}}));
}

}  // namespace
}  // namespace ddp
