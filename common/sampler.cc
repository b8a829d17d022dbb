#include "common/sampler.h"

#include <limits>
#include <numeric>
#include <random>
#include <utility>

namespace ddp {

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
  const uint64_t n = o.dataset_size;
  std::vector<int64_t> all;
  if (o.shuffle) {
    all = TorchRandperm(n, o.seed + o.epoch);
  } else {
    all.resize(n);
    std::iota(all.begin(), all.end(), int64_t{0});
  }
  const uint64_t per_rank = SamplesPerRank(n, o.world_size, o.drop_last);
  const uint64_t total = per_rank * o.world_size;
  if (total > n && n > 0) {
    // Wrap-around padding: repeat the permutation from its start.
    all.reserve(total);
    for (uint64_t i = 0; all.size() < total; ++i) all.push_back(all[i % n]);
  } else {
    all.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(per_rank);
  for (uint64_t i = o.rank; i < total; i += o.world_size) mine.push_back(all[i]);
  return mine;
}

}  // namespace ddp
