// The randomness of one sample's augmentation, drawn from (job seed, epoch,
// dataset index) alone: the same crop and flip for that sample whatever the
// loader's thread count, across re-formations and after a resume, so any
// step can be replayed to the bit. (PyTorch's DataLoader draws from
// per-worker generators, so its augmentations depend on num_workers.)
//
// A counter-based stream: SplitMix64 over a key mixed from the three
// numbers. Not thread-safe (one per sample); cheap to make.
#ifndef DDP_WORKER_DATA_SAMPLE_RANDOM_H_
#define DDP_WORKER_DATA_SAMPLE_RANDOM_H_

#include <cstdint>

namespace ddp {

class SampleRandom {
 public:
  SampleRandom(uint64_t seed, uint64_t epoch, int64_t index);

  uint64_t NextU64();
  // Uniform in [0, 1), 53 bits.
  double Uniform();
  // Uniform in [lo, hi).
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [lo, hi) (hi > lo), without modulo bias.
  int64_t Integer(int64_t lo, int64_t hi);

 private:
  uint64_t state_;
};

}  // namespace ddp

#endif  // DDP_WORKER_DATA_SAMPLE_RANDOM_H_
