#include "common/sampler.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace ddp {
namespace {

using Indices = std::vector<int64_t>;

// Values printed by python3-torch 1.13 (the same build as libtorch-dev);
// tests/py/sampler_parity_test.py checks many more against it live.
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

// The epoch's order P, built here independently of the code under test.
Indices EpochOrder(const SamplerOptions& o) {
  if (o.shuffle) return TorchRandperm(o.dataset_size, o.seed + o.epoch);
  Indices all(o.dataset_size);
  std::iota(all.begin(), all.end(), int64_t{0});
  return all;
}

// The rule, written as DistributedSampler.__iter__ applied to the suffix
// P[cursor:]: pad by repeating the list (or truncate), then stride by rank.
Indices RuleIndices(const SamplerOptions& o, uint64_t cursor) {
  const Indices order = EpochOrder(o);
  Indices list(order.begin() + static_cast<int64_t>(std::min(cursor, o.dataset_size)), order.end());
  const uint64_t len = list.size(), w = o.world_size;
  const uint64_t num_samples = o.drop_last ? len / w : (len + w - 1) / w;
  const uint64_t total = num_samples * w;
  if (total > len) {
    const Indices once = list;
    while (list.size() < total) list.insert(list.end(), once.begin(), once.end());
  }
  list.resize(total);
  Indices mine;
  for (uint64_t i = o.rank; i < total; i += w) mine.push_back(list[i]);
  return mine;
}

TEST(Sampler, ElasticIndices_CursorZero_EqualsDistributedSampler) {
  int configs = 0;
  for (uint64_t size : {0, 1, 2, 5, 7, 10, 64, 100, 1001}) {
    for (uint32_t world : {1, 2, 3, 4, 5, 8}) {
      for (uint64_t seed : {0, 42}) {
        for (bool shuffle : {true, false}) {
          for (bool drop_last : {false, true}) {
            for (uint32_t rank = 0; rank < world; ++rank) {
              SamplerOptions o;
              o.dataset_size = size;
              o.seed = seed;
              o.epoch = 3;
              o.rank = rank;
              o.world_size = world;
              o.shuffle = shuffle;
              o.drop_last = drop_last;
              const Indices elastic = ElasticSamplerIndices(o, 0);
              ASSERT_EQ(elastic, DistributedSamplerIndices(o))
                  << "size=" << size << " world=" << world << " rank=" << rank;
              ASSERT_EQ(elastic, RuleIndices(o, 0))
                  << "size=" << size << " world=" << world << " rank=" << rank;
              ++configs;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(configs, 500);
}

// Printed by python3-torch: DistributedSampler over P[4:] of
// randperm(10, seed 7) = [5, 0, 3, 4, 1, 7, 9, 6, 8, 2].
TEST(Sampler, ElasticIndices_ShuffledSuffix_MatchesPyTorch) {
  SamplerOptions o;
  o.dataset_size = 10;
  o.seed = 5;
  o.epoch = 2;
  o.world_size = 4;
  const std::vector<Indices> padded = {{1, 8}, {7, 2}, {9, 1}, {6, 7}};
  const std::vector<Indices> dropped = {{1}, {7}, {9}, {6}};
  for (uint32_t r = 0; r < 4; ++r) {
    o.rank = r;
    o.drop_last = false;
    EXPECT_EQ(ElasticSamplerIndices(o, 4), padded[r]) << r;
    o.drop_last = true;
    EXPECT_EQ(ElasticSamplerIndices(o, 4), dropped[r]) << r;
  }
}

TEST(Sampler, ElasticIndices_NoShuffle_PadsWithinTheSuffix) {
  SamplerOptions o;
  o.dataset_size = 10;
  o.world_size = 3;
  o.shuffle = false;
  // S = 3..9 padded to 9 positions with 3, 4 (not with 0, 1).
  const std::vector<Indices> padded = {{3, 6, 9}, {4, 7, 3}, {5, 8, 4}};
  const std::vector<Indices> dropped = {{3, 6}, {4, 7}, {5, 8}};
  for (uint32_t r = 0; r < 3; ++r) {
    o.rank = r;
    o.drop_last = false;
    EXPECT_EQ(ElasticSamplerIndices(o, 3), padded[r]) << r;
    o.drop_last = true;
    EXPECT_EQ(ElasticSamplerIndices(o, 3), dropped[r]) << r;
  }
}

TEST(Sampler, ElasticIndices_AnyCursor_EqualsRuleOnSuffix) {
  for (uint64_t size : {1, 2, 7, 13, 40}) {
    for (uint32_t world : {1, 2, 3, 5, 8}) {
      for (bool shuffle : {true, false}) {
        for (bool drop_last : {false, true}) {
          for (uint64_t cursor = 0; cursor <= size; ++cursor) {
            for (uint32_t rank = 0; rank < world; ++rank) {
              SamplerOptions o;
              o.dataset_size = size;
              o.seed = 11;
              o.epoch = 1;
              o.rank = rank;
              o.world_size = world;
              o.shuffle = shuffle;
              o.drop_last = drop_last;
              const Indices mine = ElasticSamplerIndices(o, cursor);
              ASSERT_EQ(mine, RuleIndices(o, cursor))
                  << "size=" << size << " world=" << world << " rank=" << rank
                  << " cursor=" << cursor << " drop_last=" << drop_last;
              ASSERT_EQ(mine.size(), SamplesPerRankFrom(size, cursor, world, drop_last));
            }
          }
        }
      }
    }
  }
}

TEST(Sampler, ElasticIndices_CursorAtOrPastEnd_IsEmpty) {
  SamplerOptions o;
  o.dataset_size = 10;
  o.world_size = 3;
  for (uint32_t r = 0; r < 3; ++r) {
    o.rank = r;
    EXPECT_TRUE(ElasticSamplerIndices(o, 10).empty());
    EXPECT_TRUE(ElasticSamplerIndices(o, 11).empty());
  }
}

struct CursorCase {
  const char* what;
  uint64_t size, cursor;
  uint32_t world;
  uint64_t batch;
  bool drop_last;
  uint64_t per_rank, batches;
  // cursor_after[k]: CursorAfterBatches(..., k) for k = 0..batches.
  std::vector<uint64_t> cursor_after;
};

TEST(Sampler, CursorArithmetic_Table) {
  const CursorCase cases[] = {
      {"whole epoch, even", 12, 0, 3, 2, false, 4, 2, {0, 6, 12}},
      {"R < W pads", 10, 8, 4, 1, false, 1, 1, {8, 10}},
      {"R == 0", 10, 10, 4, 3, false, 0, 0, {10}},
      {"R == 0, drop_last", 10, 10, 4, 3, true, 0, 0, {10}},
      {"cursor past the end", 10, 12, 2, 3, false, 0, 0, {10}},
      {"drop_last, R < W: nothing to run, jump to N", 10, 8, 4, 1, true, 0, 0, {10}},
      {"batch does not divide n_r", 100, 0, 3, 8, false, 34, 5, {0, 24, 48, 72, 96, 100}},
      {"batch does not divide n_r, drop_last", 100, 0, 3, 8, true, 33, 4, {0, 24, 48, 72, 100}},
      {"mid-epoch, padded", 100, 37, 4, 5, false, 16, 4, {37, 57, 77, 97, 100}},
      {"mid-epoch, drop_last", 100, 37, 4, 5, true, 15, 3, {37, 57, 77, 100}},
      {"B > n_r", 10, 4, 2, 8, false, 3, 1, {4, 10}},
      {"B > n_r, drop_last: nothing to run", 10, 4, 2, 8, true, 3, 0, {10}},
      {"one rank", 7, 2, 1, 2, false, 5, 3, {2, 4, 6, 7}},
  };
  for (const CursorCase& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(SamplesPerRankFrom(c.size, c.cursor, c.world, c.drop_last), c.per_rank);
    EXPECT_EQ(NumBatchesFrom(c.size, c.cursor, c.world, c.batch, c.drop_last), c.batches);
    ASSERT_EQ(c.cursor_after.size(), c.batches + 1);
    for (uint64_t k = 0; k <= c.batches; ++k) {
      EXPECT_EQ(CursorAfterBatches(c.size, c.cursor, c.world, c.batch, c.drop_last, k),
                c.cursor_after[k])
          << "after " << k << " batches";
    }
    // Past the last batch is still the end of the epoch.
    EXPECT_EQ(CursorAfterBatches(c.size, c.cursor, c.world, c.batch, c.drop_last, c.batches + 1),
              c.size);
  }
}

TEST(Sampler, CursorArithmetic_CursorZero_MatchesWholeEpoch) {
  for (uint64_t size : {1, 9, 10, 1001, 60000}) {
    for (uint32_t world : {1, 3, 8}) {
      for (bool drop_last : {false, true}) {
        EXPECT_EQ(SamplesPerRankFrom(size, 0, world, drop_last),
                  SamplesPerRank(size, world, drop_last));
      }
    }
  }
}

// One epoch run through a sequence of generations, using only the functions
// above, recording what every rank trains.
class EpochSimulation {
 public:
  EpochSimulation(const SamplerOptions& base, uint64_t batch)
      : base_(base), batch_(batch), order_(EpochOrder(base)), count_(base.dataset_size, 0) {}

  uint64_t cursor() const { return cursor_; }
  bool done() const { return cursor_ == base_.dataset_size; }
  const std::vector<int>& count() const { return count_; }

  // A generation of `world` ranks that all finish `batches_done` micro-batches
  // (at most NumBatchesFrom) and then stop: by a fault, or the epoch's end.
  void RunGeneration(uint32_t world, uint64_t batches_done) {
    const uint64_t n = base_.dataset_size;
    const uint64_t batches = NumBatchesFrom(n, cursor_, world, batch_, base_.drop_last);
    ASSERT_LE(batches_done, batches);
    std::vector<int64_t> trained;
    for (uint32_t r = 0; r < world; ++r) {
      SamplerOptions o = base_;
      o.rank = r;
      o.world_size = world;
      const Indices mine = ElasticSamplerIndices(o, cursor_);
      const uint64_t take = std::min<uint64_t>(batches_done * batch_, mine.size());
      trained.insert(trained.end(), mine.begin(), mine.begin() + static_cast<int64_t>(take));
    }
    for (int64_t i : trained) ++count_[i];
    const uint64_t next =
        CursorAfterBatches(n, cursor_, world, batch_, base_.drop_last, batches_done);
    ASSERT_GE(next, cursor_);
    if (batches_done < batches) {
      // A fault: this generation trained exactly P[cursor:next], each once.
      Indices expected(order_.begin() + static_cast<int64_t>(cursor_),
                       order_.begin() + static_cast<int64_t>(next));
      std::sort(expected.begin(), expected.end());
      std::sort(trained.begin(), trained.end());
      ASSERT_EQ(trained, expected) << "cursor " << cursor_ << " -> " << next;
      // So everything trained so far is the prefix P[0:next].
      for (uint64_t p = 0; p < n; ++p) {
        ASSERT_EQ(count_[order_[p]] > 0, p < next) << "position " << p << " cursor " << next;
      }
      if (next > cursor_) ++stats_.faults_after_progress;
    } else {
      // The end of the epoch: every rank ran its whole list, so the
      // generation trained all of the suffix, or with drop_last its first
      // world * batches * batch positions, once each.
      ASSERT_EQ(next, n);
      const uint64_t rest = n - cursor_;
      const uint64_t end = cursor_ + (base_.drop_last ? world * batches_done * batch_ : rest);
      Indices expected(order_.begin() + static_cast<int64_t>(cursor_),
                       order_.begin() + static_cast<int64_t>(end));
      std::sort(expected.begin(), expected.end());
      std::sort(trained.begin(), trained.end());
      Indices distinct = trained;
      distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
      ASSERT_EQ(distinct, expected) << "last generation from cursor " << cursor_;
      if (base_.drop_last) {
        ASSERT_EQ(trained, expected);
        if (end < n) ++stats_.dropped_tails;
      } else {
        ASSERT_EQ(trained.size(), SamplesPerRankFrom(n, cursor_, world, false) * world);
        if (trained.size() > rest) ++stats_.padded_endings;
      }
      last_rest_ = rest;
      last_world_ = world;
    }
    cursor_ = next;
  }

  // What the random runs exercised, so that they can't silently stop
  // covering the interesting cases.
  struct Stats {
    int faults_after_progress = 0;
    int padded_endings = 0;
    int dropped_tails = 0;
  };
  const Stats& stats() const { return stats_; }

  // At most how often any sample may have been trained: once, plus what the
  // padding of the generation that ended the epoch repeats.
  int MaxCount() const {
    if (base_.drop_last || last_rest_ == 0) return 1;
    const uint64_t padded = (last_rest_ + last_world_ - 1) / last_world_ * last_world_;
    const uint64_t pad = padded - last_rest_;
    return 1 + static_cast<int>((pad + last_rest_ - 1) / last_rest_);
  }

 private:
  const SamplerOptions base_;
  const uint64_t batch_;
  const Indices order_;
  std::vector<int> count_;
  uint64_t cursor_ = 0;
  uint64_t last_rest_ = 0;
  uint32_t last_world_ = 1;
  Stats stats_;
};

uint64_t Uniform(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {
  return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
}

// How many micro-batches a generation finishes before its fault: often none
// or all, otherwise anything; after `kMaxGenerations` the epoch completes.
constexpr int kMaxGenerations = 12;
uint64_t BatchesBeforeFault(std::mt19937_64& rng, uint64_t batches, int generation) {
  if (generation + 1 >= kMaxGenerations) return batches;
  switch (Uniform(rng, 0, 3)) {
    case 0:
      return 0;
    case 1:
      return batches;
    default:
      return Uniform(rng, 0, batches);
  }
}

SamplerOptions RandomOptions(std::mt19937_64& rng, uint64_t size) {
  SamplerOptions o;
  o.dataset_size = size;
  o.seed = Uniform(rng, 0, 1000);
  o.epoch = Uniform(rng, 0, 5);
  o.shuffle = Uniform(rng, 0, 1) == 1;
  return o;
}

TEST(Sampler, ElasticEpoch_RandomFaultsWithoutPadding_TrainsEverySampleOnce) {
  std::mt19937_64 rng(20240601);
  int faults = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const SamplerOptions o = RandomOptions(rng, Uniform(rng, 1, 400));
    const uint64_t batch = Uniform(rng, 1, 12);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " size " << o.dataset_size
                                      << " batch " << batch << " shuffle " << o.shuffle);
    EpochSimulation epoch(o, batch);
    for (int g = 0; !epoch.done(); ++g) {
      ASSERT_LT(g, kMaxGenerations);
      // A world size that divides what is left, so nothing is padded.
      const uint64_t rest = o.dataset_size - epoch.cursor();
      std::vector<uint32_t> fits;
      for (uint32_t w = 1; w <= 8; ++w) {
        if (rest % w == 0) fits.push_back(w);
      }
      const uint32_t world = fits[Uniform(rng, 0, fits.size() - 1)];
      const uint64_t batches = NumBatchesFrom(o.dataset_size, epoch.cursor(), world, batch, false);
      ASSERT_NO_FATAL_FAILURE(epoch.RunGeneration(world, BatchesBeforeFault(rng, batches, g)));
    }
    for (uint64_t i = 0; i < o.dataset_size; ++i) ASSERT_EQ(epoch.count()[i], 1) << "sample " << i;
    faults += epoch.stats().faults_after_progress;
  }
  EXPECT_GT(faults, 100);
}

TEST(Sampler, ElasticEpoch_RandomFaults_EverySampleAtLeastOnceAndRepeatsBounded) {
  std::mt19937_64 rng(7);
  int faults = 0, padded = 0, dropped = 0, repeated = 0, repeated_twice = 0;
  for (int trial = 0; trial < 400; ++trial) {
    SamplerOptions o = RandomOptions(rng, Uniform(rng, 1, 300));
    o.drop_last = Uniform(rng, 0, 1) == 1;
    const uint64_t batch = Uniform(rng, 1, 16);
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << " size " << o.dataset_size << " batch " << batch
                 << " shuffle " << o.shuffle << " drop_last " << o.drop_last);
    EpochSimulation epoch(o, batch);
    for (int g = 0; !epoch.done(); ++g) {
      ASSERT_LT(g, kMaxGenerations);
      const auto world = static_cast<uint32_t>(Uniform(rng, 1, 8));
      const uint64_t batches =
          NumBatchesFrom(o.dataset_size, epoch.cursor(), world, batch, o.drop_last);
      ASSERT_NO_FATAL_FAILURE(epoch.RunGeneration(world, BatchesBeforeFault(rng, batches, g)));
    }
    const int max_count = epoch.MaxCount();
    for (uint64_t i = 0; i < o.dataset_size; ++i) {
      // drop_last may skip a tail at the end of the epoch, never repeat.
      if (!o.drop_last) {
        ASSERT_GE(epoch.count()[i], 1) << "sample " << i;
      }
      ASSERT_LE(epoch.count()[i], max_count) << "sample " << i;
      if (epoch.count()[i] > 1) ++repeated;
      if (epoch.count()[i] > 2) ++repeated_twice;
    }
    faults += epoch.stats().faults_after_progress;
    padded += epoch.stats().padded_endings;
    dropped += epoch.stats().dropped_tails;
  }
  EXPECT_GT(faults, 100);
  EXPECT_GT(padded, 20);
  EXPECT_GT(dropped, 20);
  EXPECT_GT(repeated, 20);
  EXPECT_GT(repeated_twice, 0);  // a short suffix over many ranks
}

}  // namespace
}  // namespace ddp
