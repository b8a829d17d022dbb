#include "coordinator/kv_store.h"

#include <optional>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

class KvStoreTest : public testing::Test {
 protected:
  // Records the result of one Get.
  KvStore::GetCallback Capture(std::optional<absl::StatusOr<std::string>>* out) {
    return [out](absl::StatusOr<std::string> v) { *out = std::move(v); };
  }
  absl::Time In(absl::Duration d) { return clock_.Now() + d; }

  FakeClock clock_;
  KvStore store_{&clock_};
};

TEST_F(KvStoreTest, Get_KeyAlreadySet_AnswersAtOnce) {
  store_.Set("job/1/", "k", "v");
  std::optional<absl::StatusOr<std::string>> got;
  store_.Get("job/1/", "k", In(absl::Seconds(1)), Capture(&got));
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(**got, "v");
}

TEST_F(KvStoreTest, Get_KeyMissing_WaitsUntilSet) {
  std::optional<absl::StatusOr<std::string>> got;
  store_.Get("job/1/", "k", In(absl::Seconds(10)), Capture(&got));
  EXPECT_FALSE(got.has_value());
  EXPECT_EQ(store_.num_waiters(), 1u);
  store_.Set("job/1/", "k", "late");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(**got, "late");
  EXPECT_EQ(store_.num_waiters(), 0u);
}

TEST_F(KvStoreTest, Get_PastDeadline_DeadlineExceeded) {
  std::optional<absl::StatusOr<std::string>> got;
  store_.Get("job/1/", "k", In(absl::Seconds(10)), Capture(&got));
  clock_.Advance(absl::Seconds(9));
  store_.ExpireWaiters();
  EXPECT_FALSE(got.has_value());
  clock_.Advance(absl::Seconds(2));
  store_.ExpireWaiters();
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("k")));
}

TEST_F(KvStoreTest, Namespaces_AreIsolated) {
  store_.Set("job/1/", "k", "gen1");
  std::optional<absl::StatusOr<std::string>> got;
  store_.Get("job/2/", "k", In(absl::Seconds(1)), Capture(&got));
  EXPECT_FALSE(got.has_value());
  store_.Set("job/2/", "k", "gen2");
  EXPECT_EQ(**got, "gen2");
}

TEST_F(KvStoreTest, Add_CreatesAtZeroAndWakesWaiters) {
  std::optional<absl::StatusOr<std::string>> got;
  store_.Get("j/1/", "count", In(absl::Seconds(1)), Capture(&got));
  EXPECT_EQ(*store_.Add("j/1/", "count", 2), 2);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(**got, "2");
  EXPECT_EQ(*store_.Add("j/1/", "count", -5), -3);
}

TEST_F(KvStoreTest, Add_OnNonInteger_InvalidArgument) {
  store_.Set("j/1/", "k", "not a number");
  EXPECT_THAT(store_.Add("j/1/", "k", 1), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(KvStoreTest, DropNamespaces_RemovesKeysAndAbortsWaiters) {
  store_.Set("j/1/", "a", "x");
  store_.Set("j/2/", "a", "y");
  std::optional<absl::StatusOr<std::string>> got;
  store_.Get("j/1/", "b", In(absl::Seconds(1)), Capture(&got));
  store_.DropNamespaces("j/1/", "generation ended");
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(store_.num_keys(), 1u);
}

}  // namespace
}  // namespace ddp
