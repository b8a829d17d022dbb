#include "worker/collective/bucket_plan.h"

#include "gtest/gtest.h"

namespace ddp {
namespace {

using Plan = std::vector<std::vector<size_t>>;

TEST(BucketPlan, PlanBuckets_Table) {
  struct Case {
    std::vector<size_t> bytes;
    std::vector<size_t> order;
    size_t first_cap, cap;
    Plan want;
  };
  const Case cases[] = {
      // Everything fits in one bucket.
      {{10, 10, 10}, {2, 1, 0}, 100, 100, {{2, 1, 0}}},
      // Small first bucket, then the regular cap; a bucket closes once it
      // reaches its cap.
      {{10, 10, 10, 10, 10}, {4, 3, 2, 1, 0}, 10, 25, {{4}, {3, 2, 1}, {0}}},
      // A tensor larger than the cap gets a bucket of its own.
      {{5, 100, 5}, {0, 1, 2}, 8, 8, {{0, 1}, {2}}},
      {{5, 100, 5}, {1, 0, 2}, 8, 8, {{1}, {0, 2}}},
      // The order is kept inside and across buckets.
      {{4, 4, 4, 4}, {1, 3, 0, 2}, 8, 8, {{1, 3}, {0, 2}}},
      // No tensors, no buckets.
      {{}, {}, 8, 8, {}},
      // The last bucket goes again in first-cap pieces: it can only start
      // when backward ends.
      {{10, 10, 10, 10, 10}, {4, 3, 2, 1, 0}, 10, 100, {{4}, {3}, {2}, {1}, {0}}},
      {{3, 3, 3, 30, 1}, {4, 3, 2, 1, 0}, 2, 25, {{4, 3}, {2}, {1}, {0}}},
      // A tail of one tensor can't be split.
      {{5, 50}, {1, 0}, 8, 100, {{1}, {0}}},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(PlanBuckets(c.bytes, c.order, c.first_cap, c.cap), c.want);
  }
}

TEST(BucketPlan, PlanBuckets_WithoutTailSplit_PyTorchsPlan) {
  // The cases above whose tail is split, as PyTorch plans them.
  EXPECT_EQ(PlanBuckets({10, 10, 10, 10, 10}, {4, 3, 2, 1, 0}, 10, 100, /*split_tail=*/false),
            (std::vector<std::vector<size_t>>{{4}, {3, 2, 1, 0}}));
  EXPECT_EQ(PlanBuckets({3, 3, 3, 30, 1}, {4, 3, 2, 1, 0}, 2, 25, /*split_tail=*/false),
            (std::vector<std::vector<size_t>>{{4, 3}, {2, 1, 0}}));
}

TEST(BucketPlan, ReverseOrder_LastLayerFirst) {
  EXPECT_EQ(ReverseOrder(4), (std::vector<size_t>{3, 2, 1, 0}));
}

TEST(BucketPlan, CompleteReadyOrder_AppendsNeverReadyInReverse) {
  EXPECT_EQ(CompleteReadyOrder({3, 1}, 5), (std::vector<size_t>{3, 1, 4, 2, 0}));
  EXPECT_EQ(CompleteReadyOrder({}, 3), (std::vector<size_t>{2, 1, 0}));
  // Repeats and out-of-range entries are ignored.
  EXPECT_EQ(CompleteReadyOrder({1, 1, 9, 0}, 2), (std::vector<size_t>{1, 0}));
}

}  // namespace
}  // namespace ddp
