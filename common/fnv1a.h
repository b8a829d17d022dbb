// 64-bit FNV-1a: the one hash behind the project's fingerprints (a job
// spec's digest, replicas' parameter digests, a model's signature). Fast
// and stable across builds and machines; not cryptographic (SHA-256 pins
// input files: worker/input_files.h).
#ifndef DDP_COMMON_FNV1A_H_
#define DDP_COMMON_FNV1A_H_

#include <cstddef>
#include <cstdint>

namespace ddp {

inline constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

// `h` (kFnv1aOffset to start) extended by the `n` bytes at `data`.
inline uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  constexpr uint64_t kPrime = 1099511628211ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kPrime;
  return h;
}

}  // namespace ddp

#endif  // DDP_COMMON_FNV1A_H_
