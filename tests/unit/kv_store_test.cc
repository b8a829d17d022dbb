#include "common/kv_store.h"

#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::AllOf;
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
  ASSERT_THAT(store_.Set("job/1/", "k", "v"), IsOk());
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
  ASSERT_THAT(store_.Set("job/1/", "k", "late"), IsOk());
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
  ASSERT_THAT(store_.Set("job/1/", "k", "gen1"), IsOk());
  std::optional<absl::StatusOr<std::string>> got;
  store_.Get("job/2/", "k", In(absl::Seconds(1)), Capture(&got));
  EXPECT_FALSE(got.has_value());
  ASSERT_THAT(store_.Set("job/2/", "k", "gen2"), IsOk());
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
  ASSERT_THAT(store_.Set("j/1/", "k", "not a number"), IsOk());
  EXPECT_THAT(store_.Add("j/1/", "k", 1), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(KvStoreTest, DropNamespaces_RemovesKeysAndAbortsWaiters) {
  ASSERT_THAT(store_.Set("j/1/", "a", "x"), IsOk());
  ASSERT_THAT(store_.Set("j/2/", "a", "y"), IsOk());
  std::optional<absl::StatusOr<std::string>> got;
  store_.Get("j/1/", "b", In(absl::Seconds(1)), Capture(&got));
  store_.DropNamespaces("j/1/", "generation ended");
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(store_.num_keys(), 1u);
}

// A store with small limits, to reach them quickly.
class KvStoreLimitsTest : public KvStoreTest {
 protected:
  static KvStore::Options Small() {
    KvStore::Options o;
    o.max_key_bytes = 8;
    o.max_value_bytes = 100;
    o.max_keys_per_namespace = 3;
    o.max_namespace_bytes = 150;
    o.max_waiters = 2;
    return o;
  }
  KvStore small_{&clock_, Small()};
};

TEST_F(KvStoreTest, DefaultLimits_AreTheDocumentedOnes) {
  EXPECT_EQ(store_.options().max_key_bytes, 512u);
  EXPECT_EQ(store_.options().max_value_bytes, 1u << 20);
  EXPECT_EQ(store_.options().max_keys_per_namespace, 100000u);
  EXPECT_EQ(store_.options().max_namespace_bytes, 64u << 20);
  EXPECT_EQ(store_.options().max_waiters, 100000u);
}

TEST_F(KvStoreTest, StoreSet_ValueOverLimit_ResourceExhaustedNamingTheLimit) {
  EXPECT_THAT(store_.Set("j/1/", "k", std::string((1 << 20) + 1, 'v')),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("value limit"), HasSubstr("1048576 bytes"))));
  EXPECT_EQ(store_.num_keys(), 0u);
  EXPECT_THAT(store_.Set("j/1/", "k", std::string(1 << 20, 'v')), IsOk());
}

TEST_F(KvStoreTest, StoreSet_KeyOverLimit_InvalidArgumentQuotedShort) {
  const absl::Status s = store_.Set("j/1/", std::string(3 << 20, 'k'), "v");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          AllOf(HasSubstr("key limit is 512 bytes"), HasSubstr("3145728 bytes"))));
  EXPECT_LT(s.message().size(), 300u);
  EXPECT_THAT(store_.Set("j/1/", "", "v"), StatusIs(absl::StatusCode::kInvalidArgument));
  std::optional<absl::StatusOr<std::string>> got;
  EXPECT_EQ(store_.Get("j/1/", std::string(513, 'k'), In(absl::Seconds(1)), Capture(&got)), 0u);
  EXPECT_THAT(*got, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(store_.num_waiters(), 0u);
}

TEST_F(KvStoreLimitsTest, StoreSet_KeysPerNamespaceOverLimit_ResourceExhausted) {
  for (const char* key : {"a", "b", "c"}) ASSERT_THAT(small_.Set("j/1/", key, "v"), IsOk());
  EXPECT_THAT(small_.Set("j/1/", "d", "v"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("3 keys"), HasSubstr("limit per namespace"))));
  EXPECT_THAT(small_.Add("j/1/", "e", 1), StatusIs(absl::StatusCode::kResourceExhausted));
  // Existing keys can change; other namespaces have their own limit.
  EXPECT_THAT(small_.Set("j/1/", "a", "w"), IsOk());
  EXPECT_THAT(small_.Set("j/2/", "d", "v"), IsOk());
}

TEST_F(KvStoreLimitsTest, StoreSet_NamespaceBytesOverLimit_ResourceExhausted) {
  ASSERT_THAT(small_.Set("j/1/", "a", std::string(99, 'v')), IsOk());  // 100 bytes with the key
  EXPECT_EQ(small_.namespace_bytes("j/1/"), 100u);
  EXPECT_THAT(small_.Set("j/1/", "b", std::string(50, 'v')),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("151 bytes"), HasSubstr("limit per namespace is 150"))));
  // Replacing a value counts only the difference.
  ASSERT_THAT(small_.Set("j/1/", "a", std::string(10, 'v')), IsOk());
  EXPECT_EQ(small_.namespace_bytes("j/1/"), 11u);
  EXPECT_THAT(small_.Set("j/1/", "b", std::string(50, 'v')), IsOk());
  // A dropped namespace frees its bytes.
  small_.DropNamespaces("j/1/", "over");
  EXPECT_EQ(small_.namespace_bytes("j/1/"), 0u);
  EXPECT_THAT(small_.Set("j/1/", "c", std::string(99, 'v')), IsOk());
}

TEST_F(KvStoreLimitsTest, Get_WaitersOverLimit_ResourceExhausted) {
  std::optional<absl::StatusOr<std::string>> a, b, c;
  EXPECT_NE(small_.Get("j/1/", "a", In(absl::Seconds(5)), Capture(&a)), 0u);
  EXPECT_NE(small_.Get("j/1/", "b", In(absl::Seconds(5)), Capture(&b)), 0u);
  EXPECT_EQ(small_.Get("j/1/", "c", In(absl::Seconds(5)), Capture(&c)), 0u);
  EXPECT_THAT(*c, StatusIs(absl::StatusCode::kResourceExhausted,
                           AllOf(HasSubstr("2 store gets"), HasSubstr("limit"))));
  // A key that exists is answered whatever the number waiting.
  ASSERT_THAT(small_.Set("j/1/", "x", "v"), IsOk());
  std::optional<absl::StatusOr<std::string>> x;
  small_.Get("j/1/", "x", In(absl::Seconds(5)), Capture(&x));
  EXPECT_EQ(**x, "v");
}

TEST_F(KvStoreTest, Cancel_WaitingGet_AnsweredCancelledAndDropped) {
  std::optional<absl::StatusOr<std::string>> got;
  const KvStore::WaiterId id = store_.Get("j/1/", "k", In(absl::Hours(1)), Capture(&got));
  ASSERT_NE(id, 0u);
  store_.Cancel(id);
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(store_.num_waiters(), 0u);
  // Later events find nothing to answer.
  got.reset();
  ASSERT_THAT(store_.Set("j/1/", "k", "v"), IsOk());
  store_.Cancel(id);
  EXPECT_FALSE(got.has_value());
}

TEST_F(KvStoreTest, Cancel_AfterAnswer_DoesNothing) {
  int calls = 0;
  const KvStore::WaiterId id =
      store_.Get("j/1/", "k", In(absl::Hours(1)), [&](absl::StatusOr<std::string>) { ++calls; });
  ASSERT_THAT(store_.Set("j/1/", "k", "v"), IsOk());
  store_.Cancel(id);
  store_.Cancel(0);
  EXPECT_EQ(calls, 1);
}

TEST_F(KvStoreTest, Cancel_TwentyThousandAbandonedWaits_NothingHeld) {
  std::vector<KvStore::WaiterId> ids;
  int cancelled = 0;
  for (int i = 0; i < 20000; ++i) {
    ids.push_back(store_.Get("j/1/", absl::StrCat("key-", i % 100), In(absl::Hours(1)),
                             [&](absl::StatusOr<std::string> v) {
                               cancelled += v.status().code() == absl::StatusCode::kCancelled;
                             }));
  }
  EXPECT_EQ(store_.num_waiters(), 20000u);
  for (KvStore::WaiterId id : ids) store_.Cancel(id);
  EXPECT_EQ(cancelled, 20000);
  EXPECT_EQ(store_.num_waiters(), 0u);
  EXPECT_EQ(store_.num_keys(), 0u);
}

TEST_F(KvStoreTest, ExpireWaiters_OnlyThosePastTheirDeadline) {
  std::optional<absl::StatusOr<std::string>> early, late;
  store_.Get("j/1/", "k", In(absl::Seconds(20)), Capture(&late));
  store_.Get("j/1/", "k", In(absl::Seconds(10)), Capture(&early));
  clock_.Advance(absl::Seconds(15));
  store_.ExpireWaiters();
  EXPECT_THAT(*early, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_FALSE(late.has_value());
  ASSERT_THAT(store_.Set("j/1/", "k", "v"), IsOk());
  EXPECT_EQ(**late, "v");
}

TEST_F(KvStoreTest, StoreAdd_Overflow_OutOfRangeAndUnchanged) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(*store_.Add("j/1/", "n", max), max);
  EXPECT_THAT(store_.Add("j/1/", "n", 1),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("does not fit")));
  EXPECT_EQ(*store_.Add("j/1/", "n", 0), max);
  EXPECT_EQ(*store_.Add("j/1/", "m", std::numeric_limits<int64_t>::min()),
            std::numeric_limits<int64_t>::min());
  EXPECT_THAT(store_.Add("j/1/", "m", -1), StatusIs(absl::StatusCode::kOutOfRange));
}

}  // namespace
}  // namespace ddp
