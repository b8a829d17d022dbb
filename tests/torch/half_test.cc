// The communicators' 16-bit conversions (worker/collective/half.h) round as LibTorch's
// c10::Half and c10::BFloat16 do, so a compressed all-reduce sums the
// values PyTorch's compress hooks would.
#include "worker/collective/half.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace ddp {
namespace {

std::vector<float> Probes() {
  std::vector<float> probes = {0.0f,
                               -0.0f,
                               1.0f,
                               65504.0f,
                               65519.99f,
                               65520.0f,
                               1e6f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min(),
                               std::ldexp(1.0f, -14),
                               std::ldexp(1.0f, -24),
                               std::ldexp(1.0f, -25),
                               std::ldexp(1.5f, -25),
                               std::ldexp(3.0f, -26)};
  // Every tie and its neighbours, for both types' rounding positions.
  for (uint32_t base : {0x3f800000u, 0x38800000u, 0x33800000u, 0x47000000u, 0x00800000u}) {
    for (uint32_t low : {0x0fffu, 0x1000u, 0x1001u, 0x3000u, 0x7fffu, 0x8000u, 0x8001u, 0x18000u}) {
      probes.push_back(BitsFloat(base | low));
      probes.push_back(-BitsFloat(base | low));
    }
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float f = BitsFloat(bits(rng));
    if (!std::isnan(f)) probes.push_back(f);
  }
  std::normal_distribution<float> gradient(0.0f, 1e-3f);
  for (int i = 0; i < 100000; ++i) probes.push_back(gradient(rng));
  return probes;
}

TEST(Half, Float16_RoundsAsC10Half) {
  for (float f : Probes()) {
    ASSERT_EQ(FloatToFloat16(f), c10::Half(f).x) << std::hexfloat << f;
  }
}

TEST(Half, Float16_EveryValueWidensAsC10Half) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const c10::Half h(static_cast<uint16_t>(bits), c10::Half::from_bits());
    const float want = static_cast<float>(h);
    const float got = Float16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << bits;
    } else {
      ASSERT_EQ(FloatBits(got), FloatBits(want)) << bits;
    }
  }
}

TEST(Half, BFloat16_RoundsAndWidensAsC10BFloat16) {
  for (float f : Probes()) {
    const c10::BFloat16 want(f);
    ASSERT_EQ(FloatToBFloat16(f), want.x) << std::hexfloat << f;
    ASSERT_EQ(FloatBits(BFloat16ToFloat(want.x)), FloatBits(static_cast<float>(want)));
  }
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(Float16ToFloat(FloatToFloat16(std::nanf("")))));
}

// The communicators' array sums (F16C for float16 where the CPU has it) are
// AddHalf's, bit for bit, over random 16-bit patterns (infinities,
// subnormals, overflow to infinity) at lengths that leave a scalar tail. A
// NaN need only be a NaN: which NaN's sign an add keeps depends on the
// order the compiler gives the operands.
TEST(Half, AddHalves_EqualsAddHalfForEveryPatternPair) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffff);
  for (HalfType type : {HalfType::kFloat16, HalfType::kBFloat16}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{300001}}) {
      std::vector<uint16_t> a(n), b(n);
      for (size_t i = 0; i < n; ++i) {
        a[i] = static_cast<uint16_t>(bits(rng));
        // Half the time a close neighbour of -a: sums near zero, subnormals.
        b[i] = i % 2 ? static_cast<uint16_t>(bits(rng)) : static_cast<uint16_t>(a[i] ^ 0x8001);
      }
      std::vector<uint16_t> want(n);
      for (size_t i = 0; i < n; ++i) want[i] = AddHalf(a[i], b[i], type);
      AddHalves(a.data(), b.data(), n, type);
      auto widen = [type](uint16_t h) {
        return type == HalfType::kFloat16 ? Float16ToFloat(h) : BFloat16ToFloat(h);
      };
      for (size_t i = 0; i < n; ++i) {
        if (std::isnan(widen(want[i]))) {
          ASSERT_TRUE(std::isnan(widen(a[i]))) << "element " << i;
        } else {
          ASSERT_EQ(a[i], want[i]) << "type " << static_cast<int>(type) << " element " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ddp
