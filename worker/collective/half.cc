#include "worker/collective/half.h"

#include <cpuid.h>
#include <immintrin.h>

namespace ddp {
namespace {

// One loop per type, so the compiler can vectorize bfloat16's bit
// arithmetic.
void AddHalvesScalar(uint16_t* dst, const uint16_t* src, size_t n, HalfType type) {
  if (type == HalfType::kBFloat16) {
    for (size_t i = 0; i < n; ++i) dst[i] = AddHalf(dst[i], src[i], HalfType::kBFloat16);
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = AddHalf(dst[i], src[i], HalfType::kFloat16);
}

// Eight float16 sums at a time with the CPU's own conversions (F16C), which
// round to nearest even as FloatToFloat16 does; only a NaN differs (the
// hardware keeps its payload), so NaN lanes get FloatToFloat16's NaN.
__attribute__((target("avx2,f16c"))) void AddFloat16Vector(uint16_t* dst, const uint16_t* src,
                                                           size_t n) {
  const __m256i canonical_nan = _mm256_set1_epi32(0x7e00);
  const __m256i sign_mask = _mm256_set1_epi32(0x8000);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(dst + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256 sum = _mm256_add_ps(_mm256_cvtph_ps(a), _mm256_cvtph_ps(b));
    __m128i rounded = _mm256_cvtps_ph(sum, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 nan = _mm256_cmp_ps(sum, sum, _CMP_UNORD_Q);
    if (_mm256_movemask_ps(nan) != 0) {
      // sign | 0x7e00 per lane, packed to 16 bits where the sum is NaN.
      const __m256i sign =
          _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(sum), 16), sign_mask);
      const __m256i quiet = _mm256_or_si256(sign, canonical_nan);
      const __m256i widened = _mm256_cvtepu16_epi32(rounded);
      const __m256i fixed = _mm256_blendv_epi8(widened, quiet, _mm256_castps_si256(nan));
      rounded = _mm_packus_epi32(_mm256_castsi256_si128(fixed), _mm256_extracti128_si256(fixed, 1));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), rounded);
  }
  AddHalvesScalar(dst + i, src + i, n - i, HalfType::kFloat16);
}

// AVX2 (which also says the OS saves the vector registers) and F16C
// (CPUID leaf 1, ECX bit 29: clang has no name for it in the builtin).
bool HasFloat16Vector() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
           (ecx & (1u << 29)) != 0;
  }();
  return has;
}

}  // namespace

void AddHalves(uint16_t* dst, const uint16_t* src, size_t n, HalfType type) {
  if (type == HalfType::kFloat16 && HasFloat16Vector()) {
    AddFloat16Vector(dst, src, n);
    return;
  }
  AddHalvesScalar(dst, src, n, type);
}

}  // namespace ddp
