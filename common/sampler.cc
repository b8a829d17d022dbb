#include "common/sampler.h"

#include <limits>
#include <numeric>
#include <random>
#include <utility>

namespace ddp {
namespace {

// R: the samples of the epoch not yet trained.
uint64_t Remaining(uint64_t dataset_size, uint64_t cursor) {
  return cursor < dataset_size ? dataset_size - cursor : 0;
}

}  // namespace

uint64_t SamplesPerRank(uint64_t dataset_size, uint32_t world_size, bool drop_last) {
  if (drop_last && dataset_size % world_size != 0) {
    // Python: math.ceil((len - num_replicas) / num_replicas), which for
    // len < num_replicas is 0 or negative; we clamp at 0.
    if (dataset_size < world_size) return 0;
    return (dataset_size - world_size + world_size - 1) / world_size;
  }
  return (dataset_size + world_size - 1) / world_size;
}

std::vector<int64_t> TorchRandperm(uint64_t n, uint64_t seed) {
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (n < 2) return perm;
  // at::mt19937 seeds exactly like std::mt19937 from the low 32 bits.
  std::mt19937 engine(static_cast<uint32_t>(seed));
  // PyTorch switches to 64-bit draws only for very large n.
  const bool wide = n >= std::numeric_limits<uint32_t>::max() / 20;
  for (uint64_t i = 0; i + 1 < n; ++i) {
    uint64_t r;
    if (wide) {
      // CPUGeneratorImpl::random64: two 32-bit draws, high word first.
      const uint64_t hi = engine();
      const uint64_t lo = engine();
      r = (hi << 32) | lo;
    } else {
      r = engine();
    }
    const uint64_t z = r % (n - i);
    std::swap(perm[i], perm[i + z]);
  }
  return perm;
}

std::vector<int64_t> DistributedSamplerIndices(const SamplerOptions& o) {
  return ElasticSamplerIndices(o, 0);
}

std::vector<int64_t> ElasticSamplerIndices(const SamplerOptions& o, uint64_t cursor) {
  const uint64_t rest = Remaining(o.dataset_size, cursor);
  const uint64_t first = o.dataset_size - rest;
  const uint64_t per_rank = SamplesPerRank(rest, o.world_size, o.drop_last);
  std::vector<int64_t> mine;
  if (per_rank == 0) return mine;
  // The order P is all positions 0..N-1 permuted, even when the cursor leaves
  // only a few of them: the suffix must be the same whatever the cursor.
  std::vector<int64_t> order;
  if (o.shuffle) order = TorchRandperm(o.dataset_size, o.seed + o.epoch);
  mine.reserve(per_rank);
  for (uint64_t i = 0; i < per_rank; ++i) {
    // Position j of the padded suffix; padding wraps around within the
    // suffix, which with drop_last (j < rest) never happens.
    const uint64_t j = o.rank + i * o.world_size;
    const uint64_t p = first + j % rest;
    mine.push_back(o.shuffle ? order[p] : static_cast<int64_t>(p));
  }
  return mine;
}

uint64_t SamplesPerRankFrom(uint64_t dataset_size, uint64_t cursor, uint32_t world_size,
                            bool drop_last) {
  return SamplesPerRank(Remaining(dataset_size, cursor), world_size, drop_last);
}

uint64_t NumBatchesFrom(uint64_t dataset_size, uint64_t cursor, uint32_t world_size,
                        uint64_t batch_size, bool drop_last) {
  const uint64_t per_rank = SamplesPerRankFrom(dataset_size, cursor, world_size, drop_last);
  return drop_last ? per_rank / batch_size : (per_rank + batch_size - 1) / batch_size;
}

uint64_t CursorAfterBatches(uint64_t dataset_size, uint64_t cursor, uint32_t world_size,
                            uint64_t batch_size, bool drop_last, uint64_t batches_done) {
  if (batches_done >= NumBatchesFrom(dataset_size, cursor, world_size, batch_size, drop_last)) {
    // The epoch is over: padding ran past the end, or drop_last skipped a
    // tail that no later generation of this epoch may train either.
    return dataset_size;
  }
  // Before the last batch every rank has run only full batches of real
  // (unpadded) positions: batches_done * batch_size < n_r, and
  // world_size * (n_r - 1) < R, so neither min of the formula binds.
  return cursor + uint64_t{world_size} * batches_done * batch_size;
}

}  // namespace ddp
