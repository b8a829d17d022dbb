// 16-bit floats as the communicators carry them: IEEE half (float16) and
// bfloat16, converted with round-to-nearest-even as LibTorch converts them,
// so that a compressed all-reduce sums what PyTorch's fp16/bf16 hooks sum.
// Torch-free: the communicators don't link LibTorch.
#ifndef DDP_WORKER_COLLECTIVE_HALF_H_
#define DDP_WORKER_COLLECTIVE_HALF_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ddp {

enum class HalfType { kFloat16, kBFloat16 };

inline uint32_t FloatBits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  return x;
}

inline float BitsFloat(uint32_t x) {
  float f;
  std::memcpy(&f, &x, sizeof(f));
  return f;
}

inline uint16_t FloatToFloat16(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs = x & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00;  // NaN
  // 65520 and up round to infinity (65504 is the largest half).
  if (abs >= 0x477ff000) return sign | 0x7c00;
  if (abs >= 0x38800000) {  // a normal half: rebias the exponent, round 13 bits off
    uint32_t h = (abs - 0x38000000) >> 13;
    const uint32_t rest = abs & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (abs <= 0x33000000) return sign;  // 2^-25 and below: zero (a tie rounds to it)
  // A subnormal half: a count of 2^-24.
  const uint32_t exponent = abs >> 23;
  const uint32_t mantissa = (abs & 0x7fffff) | 0x800000;
  const uint32_t shift = 126 - exponent;
  uint32_t q = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (q & 1))) ++q;
  return static_cast<uint16_t>(sign | q);
}

inline float Float16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0x1f) return BitsFloat(sign | 0x7f800000 | (mantissa << 13));
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return BitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t FloatToBFloat16(float f) {
  const uint32_t x = FloatBits(f);
  if (std::isnan(f)) return 0x7fc0;
  return static_cast<uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

inline float BFloat16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

// a + b in `type`: both widened to float, added, rounded back (Gloo's
// float16 sum; one rounding, as for a native 16-bit add).
inline uint16_t AddHalf(uint16_t a, uint16_t b, HalfType type) {
  if (type == HalfType::kFloat16) return FloatToFloat16(Float16ToFloat(a) + Float16ToFloat(b));
  return FloatToBFloat16(BFloat16ToFloat(a) + BFloat16ToFloat(b));
}

// dst[i] = AddHalf(dst[i], src[i], type) for i < n, bit for bit; float16
// eight at a time with the CPU's conversions where it has them (F16C).
void AddHalves(uint16_t* dst, const uint16_t* src, size_t n, HalfType type);

// dst[i] += src[i] for i < n: the float32 sum every communicator does.
inline void AddFloats(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace ddp

#endif  // DDP_WORKER_COLLECTIVE_HALF_H_
