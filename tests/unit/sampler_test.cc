#include "common/sampler.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace ddp {
namespace {

using Indices = std::vector<int64_t>;

// Values printed by python3-torch 1.13 (the same build as libtorch-dev);
// tests/parity/sampler_parity_test.py checks many more against it live.
TEST(Sampler, TorchRandperm_MatchesPyTorch) {
  EXPECT_EQ(TorchRandperm(10, 0), (Indices{4, 1, 7, 5, 3, 9, 0, 8, 6, 2}));
  EXPECT_EQ(TorchRandperm(7, 42), (Indices{1, 6, 3, 5, 4, 0, 2}));
  EXPECT_EQ(TorchRandperm(1, 3), (Indices{0}));
  EXPECT_TRUE(TorchRandperm(0, 3).empty());
}

TEST(Sampler, DistributedSamplerIndices_ShuffledWithPadding_MatchesPyTorch) {
  SamplerOptions o;
  o.dataset_size = 10;
  o.seed = 5;
  o.epoch = 2;
  o.world_size = 3;
  o.rank = 1;
  EXPECT_EQ(DistributedSamplerIndices(o), (Indices{0, 1, 6, 5}));
  o.rank = 2;
  o.drop_last = true;
  EXPECT_EQ(DistributedSamplerIndices(o), (Indices{3, 7, 8}));
}

TEST(Sampler, DistributedSamplerIndices_NoShuffle_StridesAndWrapsAround) {
  SamplerOptions o;
  o.dataset_size = 5;
  o.world_size = 2;
  o.shuffle = false;
  o.rank = 0;
  EXPECT_EQ(DistributedSamplerIndices(o), (Indices{0, 2, 4}));
  o.rank = 1;
  EXPECT_EQ(DistributedSamplerIndices(o), (Indices{1, 3, 0}));  // padded with index 0
  o.drop_last = true;
  EXPECT_EQ(DistributedSamplerIndices(o), (Indices{1, 3}));
}

TEST(Sampler, DistributedSamplerIndices_MoreRanksThanSamples_PadsByRepeating) {
  SamplerOptions o;
  o.dataset_size = 2;
  o.world_size = 5;
  o.shuffle = false;
  Indices all;
  for (uint32_t r = 0; r < 5; ++r) {
    o.rank = r;
    Indices mine = DistributedSamplerIndices(o);
    ASSERT_EQ(mine.size(), 1u);
    all.push_back(mine[0]);
  }
  EXPECT_EQ(all, (Indices{0, 1, 0, 1, 0}));
}

TEST(Sampler, DistributedSamplerIndices_EpochChangesTheShuffle) {
  SamplerOptions o;
  o.dataset_size = 1000;
  o.world_size = 2;
  const Indices epoch0 = DistributedSamplerIndices(o);
  o.epoch = 1;
  EXPECT_NE(epoch0, DistributedSamplerIndices(o));
}

TEST(Sampler, DistributedSamplerIndices_RanksPartitionTheEpoch) {
  SamplerOptions o;
  o.dataset_size = 1001;
  o.world_size = 4;
  o.seed = 9;
  std::multiset<int64_t> seen;
  for (uint32_t r = 0; r < 4; ++r) {
    o.rank = r;
    const Indices mine = DistributedSamplerIndices(o);
    EXPECT_EQ(mine.size(), SamplesPerRank(1001, 4, false));
    seen.insert(mine.begin(), mine.end());
  }
  // Every sample once, plus 3 padded repeats.
  EXPECT_EQ(seen.size(), 1004u);
  for (int64_t i = 0; i < 1001; ++i) EXPECT_GE(seen.count(i), 1u) << i;
}

TEST(Sampler, SamplesPerRank_Table) {
  EXPECT_EQ(SamplesPerRank(10, 3, false), 4u);
  EXPECT_EQ(SamplesPerRank(10, 3, true), 3u);
  EXPECT_EQ(SamplesPerRank(9, 3, true), 3u);
  EXPECT_EQ(SamplesPerRank(2, 5, true), 0u);
  EXPECT_EQ(SamplesPerRank(60000, 2, false), 30000u);
}

}  // namespace
}  // namespace ddp
