#include "common/device.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

TEST(Device, ParseDevice_AcceptedForms_Canonical) {
  struct Case {
    const char* text;
    const char* canonical;
  };
  for (const Case& c : {Case{"cpu", "cpu:0"}, Case{"cpu:0", "cpu:0"}, Case{"cpu:7", "cpu:7"},
                        Case{"cuda:0", "cuda:0"}, Case{"cuda:12", "cuda:12"}}) {
    auto d = ParseDevice(c.text);
    ASSERT_THAT(d, IsOk()) << c.text;
    EXPECT_EQ(d->ToString(), c.canonical);
  }
}

TEST(Device, ParseDevice_UnknownForms_InvalidArgumentListingTheForms) {
  for (const char* text : {"", "gpu", "cuda", "cuda:", "cuda:-1", "cuda:01", "cuda:1x", "cpu:a",
                           "CUDA:0", "cuda:99999", "tpu:0"}) {
    EXPECT_THAT(ParseDevice(text),
                StatusIs(absl::StatusCode::kInvalidArgument, testing::HasSubstr("cuda:N")))
        << text;
  }
}

}  // namespace
}  // namespace ddp
