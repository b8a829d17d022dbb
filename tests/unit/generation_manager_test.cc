#include "coordinator/generation_manager.h"

#include "gtest/gtest.h"

namespace ddp {
namespace {

std::vector<RankCandidate> Workers(int n) {
  std::vector<RankCandidate> v;
  for (int i = n - 1; i >= 0; --i) {
    v.push_back(RankCandidate{"w" + std::to_string(i), "h", Device{Device::Kind::kCpu, i}});
  }
  return v;
}

v1::JobSpec Spec(uint32_t min, uint32_t max, double settle) {
  v1::JobSpec spec;
  spec.set_min_workers(min);
  spec.set_max_workers(max);
  spec.set_settle_seconds(settle);
  return spec;
}

class GenerationManagerTest : public testing::Test {
 protected:
  FakeClock clock_;
  GenerationManager generations_{&clock_};
};

TEST_F(GenerationManagerTest, MaybeForm_MaxWorkersFree_FormsAtOnceInRankOrder) {
  auto g = generations_.MaybeForm(Spec(2, 3, 10), Workers(3));
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->number, 1u);
  ASSERT_EQ(g->members.size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(g->members[r].worker_id, "w" + std::to_string(r));
  EXPECT_EQ(g->RankOf("w2"), 2);
  EXPECT_EQ(g->RankOf("nobody"), -1);
  EXPECT_TRUE(generations_.IsCurrent(1));
}

TEST_F(GenerationManagerTest, MaybeForm_MinWorkers_WaitsForSettleWindow) {
  const auto spec = Spec(2, 4, 3);
  EXPECT_FALSE(generations_.MaybeForm(spec, Workers(1)).has_value());
  EXPECT_FALSE(generations_.MaybeForm(spec, Workers(2)).has_value());
  clock_.Advance(absl::Seconds(2));
  EXPECT_FALSE(generations_.MaybeForm(spec, Workers(2)).has_value());
  clock_.Advance(absl::Seconds(1));
  auto g = generations_.MaybeForm(spec, Workers(2));
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->members.size(), 2u);
}

TEST_F(GenerationManagerTest, MaybeForm_QuorumLost_SettleWindowStartsOver) {
  const auto spec = Spec(2, 4, 3);
  generations_.MaybeForm(spec, Workers(2));
  clock_.Advance(absl::Seconds(2));
  generations_.MaybeForm(spec, Workers(1));  // one left
  clock_.Advance(absl::Seconds(2));
  EXPECT_FALSE(generations_.MaybeForm(spec, Workers(2)).has_value());
}

TEST_F(GenerationManagerTest, MaybeForm_MoreThanMax_TakesFirstInRankOrder) {
  auto g = generations_.MaybeForm(Spec(1, 2, 0), Workers(4));
  ASSERT_TRUE(g.has_value());
  ASSERT_EQ(g->members.size(), 2u);
  EXPECT_EQ(g->members[0].worker_id, "w0");
  EXPECT_EQ(g->members[1].worker_id, "w1");
}

TEST_F(GenerationManagerTest, MaybeForm_WhileCurrent_NothingNew_NumbersGrow) {
  ASSERT_TRUE(generations_.MaybeForm(Spec(1, 1, 0), Workers(1)).has_value());
  EXPECT_FALSE(generations_.MaybeForm(Spec(1, 1, 0), Workers(1)).has_value());
  generations_.EndCurrent();
  EXPECT_FALSE(generations_.IsCurrent(1));
  auto g = generations_.MaybeForm(Spec(1, 1, 0), Workers(1));
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->number, 2u);
  EXPECT_EQ(generations_.latest(), 2u);
}

}  // namespace
}  // namespace ddp
