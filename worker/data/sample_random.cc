#include "worker/data/sample_random.h"

namespace ddp {
namespace {

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

SampleRandom::SampleRandom(uint64_t seed, uint64_t epoch, int64_t index)
    : state_(Mix(Mix(Mix(seed) ^ epoch) ^ static_cast<uint64_t>(index))) {}

uint64_t SampleRandom::NextU64() {
  state_ += 0x9e3779b97f4a7c15ULL;
  return Mix(state_);
}

double SampleRandom::Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

int64_t SampleRandom::Integer(int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo);
  // Rejection: draws in the last partial span are drawn again.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  uint64_t v;
  do {
    v = NextU64();
  } while (v >= limit);
  return lo + static_cast<int64_t>(v % span);
}

}  // namespace ddp
