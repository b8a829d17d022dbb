// The indices a rank trains on in an epoch: exactly
// torch.utils.data.distributed.DistributedSampler's for the same dataset
// size, seed, epoch, rank, world size, shuffle and drop_last. The epoch comes
// from the coordinator, so set_epoch can't be forgotten.
#ifndef DDP_COMMON_SAMPLER_H_
#define DDP_COMMON_SAMPLER_H_

#include <cstdint>
#include <vector>

namespace ddp {

struct SamplerOptions {
  uint64_t dataset_size = 0;
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  bool shuffle = true;
  bool drop_last = false;
};

// Samples each rank gets per epoch (DistributedSampler.num_samples).
uint64_t SamplesPerRank(uint64_t dataset_size, uint32_t world_size, bool drop_last);

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on CPU:
// the Fisher-Yates variant PyTorch runs over its mt19937 generator.
std::vector<int64_t> TorchRandperm(uint64_t n, uint64_t seed);

// DistributedSampler's indices for one rank and epoch: shuffle with
// seed + epoch, pad by wrapping around (or drop the tail), then take every
// world_size-th index starting at rank. Requires rank < world_size.
std::vector<int64_t> DistributedSamplerIndices(const SamplerOptions& options);

}  // namespace ddp

#endif  // DDP_COMMON_SAMPLER_H_
