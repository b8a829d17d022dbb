// The indices a rank trains on in an epoch: exactly
// torch.utils.data.distributed.DistributedSampler's for the same dataset
// size, seed, epoch, rank, world size, shuffle and drop_last. The epoch comes
// from the coordinator, so set_epoch can't be forgotten.
//
// Elastic training: the epoch cursor. An epoch is a walk through its order
// P = torch.randperm(N, seed + epoch) (0..N-1 without shuffle), and the cursor
// c is how many leading positions of P have been trained. A generation that
// starts at cursor c with world size W splits the suffix S = P[c:N]
// (R = N - c samples) exactly as DistributedSampler splits a whole dataset:
//   - without drop_last, S is padded by wrapping around within S (S repeated
//     from its start, as often as needed) to ceil(R / W) * W positions;
//   - with drop_last, S is truncated to floor(R / W) * W positions;
//   - rank r takes positions r, r + W, r + 2W, ... of that list.
// With c = 0 this is DistributedSampler, element for element. Ranks consume
// their lists in lockstep (rank r's i-th index is list position r + W * i),
// so after every rank ran k micro-batches of B the trained positions are a
// prefix of the list, and hence of S: CursorAfterBatches gives the next
// cursor. Only padding trains a sample more than once: ceil(R / W) * W - R
// (< W) extra positions per generation, all in its last micro-batch; a
// sample repeats at most once per generation unless R < W / 2 (then up to
// ceil((W - R) / R) times, as DistributedSampler with N < W). drop_last never
// repeats a sample.
//
// All functions are pure and may be called from any thread. They require
// world_size >= 1 and batch_size >= 1; a cursor past dataset_size is treated
// as dataset_size (nothing left).
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
// Same as ElasticSamplerIndices(options, 0).
std::vector<int64_t> DistributedSamplerIndices(const SamplerOptions& options);

// This rank's indices for the rest of the epoch from `cursor` (0 <= cursor <=
// dataset_size), by the rule above; cursor == dataset_size gives an empty
// list. Requires rank < world_size. O(dataset_size) time and memory.
std::vector<int64_t> ElasticSamplerIndices(const SamplerOptions& options, uint64_t cursor);

// Samples each rank gets from `cursor` to the end of the epoch (n_r, the
// length of ElasticSamplerIndices): SamplesPerRank(dataset_size - cursor).
uint64_t SamplesPerRankFrom(uint64_t dataset_size, uint64_t cursor, uint32_t world_size,
                            bool drop_last);

// Micro-batches of `batch_size` each rank runs from `cursor` to the end of
// the epoch: the last one smaller, or, with drop_last, dropped if partial
// (as the loader's NumBatches). Zero when nothing is left; with drop_last
// also when fewer than world_size samples, or than batch_size per rank, are.
uint64_t NumBatchesFrom(uint64_t dataset_size, uint64_t cursor, uint32_t world_size,
                        uint64_t batch_size, bool drop_last);

// The cursor after every rank of a generation that started at `cursor` has
// finished its first `batches_done` micro-batches:
// cursor + min(world_size * min(batches_done * batch_size, n_r), R), which
// is cursor + world_size * batches_done * batch_size before the last batch,
// and dataset_size once batches_done reaches NumBatchesFrom(...): the epoch is
// over (with drop_last, the dropped tail counts as passed). Requires
// batches_done <= NumBatchesFrom(...); more is treated as the end of the epoch.
uint64_t CursorAfterBatches(uint64_t dataset_size, uint64_t cursor, uint32_t world_size,
                            uint64_t batch_size, bool drop_last, uint64_t batches_done);

}  // namespace ddp

#endif  // DDP_COMMON_SAMPLER_H_
