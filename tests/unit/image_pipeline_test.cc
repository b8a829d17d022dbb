// A sample's augmentation is a function of (seed, epoch, index) alone: the
// same tensor whatever thread makes it and however many there are; the
// random crop's box is always inside the image, in torchvision's scale and
// ratio bounds, else its central fallback; bad pipelines are refused;
// writing straight into a buffer gives the same tensor, and the SIMD resize
// the same bytes as Pillow's fixed-point sums done plainly. (That each step
// equals torchvision's is image_folder_parity_test.py.)
#include "worker/data/image_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

RgbImage Gradient(int height, int width) {
  RgbImage image;
  image.height = height;
  image.width = width;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      image.pixels.push_back(static_cast<uint8_t>(x * 7 + y));
      image.pixels.push_back(static_cast<uint8_t>(y * 5));
      image.pixels.push_back(static_cast<uint8_t>(x ^ y));
    }
  }
  return image;
}

ImagePipeline Training() {
  ImagePipeline p;
  ImageStep crop;
  crop.kind = ImageStep::Kind::kRandomResizedCrop;
  crop.height = crop.width = 24;
  ImageStep flip;
  flip.kind = ImageStep::Kind::kRandomHorizontalFlip;
  p.steps = {crop, flip};
  p.normalize = Normalization{{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
  return p;
}

std::vector<float> Sample(const ImagePipeline& p, uint64_t seed, uint64_t epoch, int64_t index) {
  int h = 0, w = 0;
  return RunPipeline(p, Gradient(40, 56), seed, epoch, index, &h, &w);
}

TEST(ImagePipeline, SameSampleSameTensor_OtherEpochOrIndexOtherCrop) {
  const ImagePipeline p = Training();
  EXPECT_EQ(Sample(p, 7, 3, 11), Sample(p, 7, 3, 11));
  EXPECT_NE(Sample(p, 7, 3, 11), Sample(p, 7, 4, 11));
  EXPECT_NE(Sample(p, 7, 3, 11), Sample(p, 7, 3, 12));
  EXPECT_NE(Sample(p, 7, 3, 11), Sample(p, 8, 3, 11));
}

TEST(ImagePipeline, ThreadCount_ChangesNothing) {
  const ImagePipeline p = Training();
  constexpr int kSamples = 48;
  std::vector<std::vector<float>> alone(kSamples), shared(kSamples);
  for (int i = 0; i < kSamples; ++i) alone[i] = Sample(p, 1, 2, i);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = kSamples - 1 - t; i >= 0; i -= 4) shared[i] = Sample(p, 1, 2, i);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(alone, shared);
}

TEST(ImagePipeline, RandomResizedCropBox_InsideTheImageAndWithinScaleAndRatio) {
  int fallbacks = 0;
  for (int index = 0; index < 2000; ++index) {
    SampleRandom random(5, 0, index);
    const int height = 30 + index % 40, width = 20 + index % 70;
    const auto [top, left, h, w] =
        RandomResizedCropBox(height, width, {0.08, 1.0}, {3.0 / 4, 4.0 / 3}, random);
    ASSERT_GE(top, 0);
    ASSERT_GE(left, 0);
    ASSERT_GT(h, 0);
    ASSERT_GT(w, 0);
    ASSERT_LE(top + h, height);
    ASSERT_LE(left + w, width);
    const double area = static_cast<double>(h) * w / (static_cast<double>(height) * width);
    const double ratio = static_cast<double>(w) / h;
    // Rounding to whole pixels moves both a little.
    if (area < 0.06 || ratio < 0.6 || ratio > 1.5) {
      // Only the central fallback may leave the bounds: the whole image's
      // side within the ratio.
      EXPECT_TRUE(h == height || w == width) << top << " " << left << " " << h << " " << w;
      ++fallbacks;
    }
  }
  EXPECT_LT(fallbacks, 100);
  // A tall thin image: no try fits the ratio; the central crop is as wide as
  // the image and 4/3 as tall.
  SampleRandom random(5, 0, 0);
  const auto box = RandomResizedCropBox(400, 30, {0.9, 1.0}, {3.0 / 4, 4.0 / 3}, random);
  EXPECT_EQ(box[3], 30);
  EXPECT_EQ(box[2], 40);
  EXPECT_EQ(box[0], 180);
}

ImageStep Step(ImageStep::Kind kind, int height, int width) {
  ImageStep s;
  s.kind = kind;
  s.height = height;
  s.width = width;
  return s;
}

TEST(ImagePipeline, RunPipelineInto_SameTensorAsRunPipeline) {
  using Kind = ImageStep::Kind;
  const ImageStep flip = Step(Kind::kRandomHorizontalFlip, 0, 0);
  const ImageStep crop = Step(Kind::kRandomResizedCrop, 24, 20);
  // Fused (the resize writes the tensor) and not, flips before and after.
  const std::vector<std::vector<ImageStep>> pipelines = {
      {crop, flip},
      {flip, crop},
      {flip, crop, flip, flip},
      {Step(Kind::kResize, 31, 17), flip},
      {Step(Kind::kResize, 40, 56)},
      {Step(Kind::kRandomResizedCrop, 90, 7)},
      {Step(Kind::kResize, 0, 30), Step(Kind::kCenterCrop, 28, 28), flip},
      {flip, Step(Kind::kResize, 0, 12)},
  };
  for (size_t p = 0; p < pipelines.size(); ++p) {
    ImagePipeline pipeline;
    pipeline.steps = pipelines[p];
    pipeline.normalize = Training().normalize;
    for (int64_t index = 0; index < 20; ++index) {
      int h = 0, w = 0;
      const std::vector<float> want = RunPipeline(pipeline, Gradient(40, 56), 3, 1, index, &h, &w);
      std::vector<float> got(want.size());
      EXPECT_EQ(RunPipelineInto(pipeline, Gradient(40, 56), 3, 1, index, h, w, got.data()),
                (std::array<int, 2>{h, w}));
      ASSERT_EQ(got, want) << "pipeline " << p << ", index " << index;
    }
  }
}

TEST(ImagePipeline, Training_SameTensorAsItsStepsOneByOne) {
  // The resize writes the tensor, mirrored as it goes: the same floats as
  // the crop, the flip and ToTensor made one after the other.
  const ImagePipeline p = Training();
  for (int64_t index = 0; index < 40; ++index) {
    SampleRandom random(9, 2, index);
    const auto [top, left, h, w] =
        RandomResizedCropBox(40, 56, p.steps[0].scale, p.steps[0].ratio, random);
    RgbImage image = ResizedCrop(Gradient(40, 56), top, left, h, w, 24, 24);
    if (random.Uniform() < p.steps[1].p) image = HorizontalFlip(image);
    int height = 0, width = 0;
    ASSERT_EQ(RunPipeline(p, Gradient(40, 56), 9, 2, index, &height, &width),
              ToTensorChw(image, p.normalize))
        << "index " << index;
  }
}

TEST(ImagePipeline, RunPipelineInto_OtherSize_WritesNothing) {
  std::vector<float> out(3 * 20 * 20, -7.0f);
  EXPECT_EQ(RunPipelineInto(Training(), Gradient(40, 56), 1, 0, 0, 20, 20, out.data()),
            (std::array<int, 2>{24, 24}));
  EXPECT_EQ(out, std::vector<float>(3 * 20 * 20, -7.0f));
}

// Pillow's bilinear resize of 8-bit images done plainly, pixel by pixel:
// the sums the SIMD passes must reproduce.
std::vector<int32_t> PlainWeights(int in, int out, int* ksize, std::vector<int>* bounds) {
  const double scale = static_cast<double>(in) / out, filterscale = std::max(scale, 1.0);
  *ksize = static_cast<int>(std::ceil(filterscale)) * 2 + 1;
  std::vector<int32_t> weights(static_cast<size_t>(out) * *ksize, 0);
  bounds->assign(static_cast<size_t>(out) * 2, 0);
  for (int o = 0; o < out; ++o) {
    const double center = (o + 0.5) * scale;
    const int lo = std::max(0, static_cast<int>(center - filterscale + 0.5));
    const int n = std::min(in, static_cast<int>(center + filterscale + 0.5)) - lo;
    std::vector<double> k(n);
    double sum = 0;
    for (int x = 0; x < n; ++x) {
      k[x] = std::max(0.0, 1.0 - std::fabs((x + lo - center + 0.5) * (1.0 / filterscale)));
      sum += k[x];
    }
    for (int x = 0; x < n; ++x) {
      weights[static_cast<size_t>(o) * *ksize + x] =
          static_cast<int32_t>(0.5 + (sum != 0 ? k[x] / sum : k[x]) * (1 << 22));
    }
    (*bounds)[o * 2] = lo;
    (*bounds)[o * 2 + 1] = n;
  }
  return weights;
}

// One pass along x (`along_x`) or y.
RgbImage PlainPass(const RgbImage& in, int size, bool along_x) {
  int ksize = 0;
  std::vector<int> bounds;
  const std::vector<int32_t> k =
      PlainWeights(along_x ? in.width : in.height, size, &ksize, &bounds);
  RgbImage out;
  out.width = along_x ? size : in.width;
  out.height = along_x ? in.height : size;
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * 3);
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      const int o = along_x ? x : y;
      for (int c = 0; c < 3; ++c) {
        int64_t s = 1 << 21;
        for (int t = 0; t < bounds[o * 2 + 1]; ++t) {
          const int sx = along_x ? bounds[o * 2] + t : x, sy = along_x ? y : bounds[o * 2] + t;
          s += in.pixels[(static_cast<size_t>(sy) * in.width + sx) * 3 + c] *
               static_cast<int64_t>(k[static_cast<size_t>(o) * ksize + t]);
        }
        out.pixels[(static_cast<size_t>(y) * out.width + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp<int64_t>(s >> 22, 0, 255));
      }
    }
  }
  return out;
}

RgbImage Noise(int height, int width, uint32_t seed) {
  RgbImage image;
  image.height = height;
  image.width = width;
  for (int i = 0; i < height * width * 3; ++i) {
    seed = seed * 1664525u + 1013904223u;
    // Runs of 0s and 255s too, where the sums clip.
    const uint8_t v = static_cast<uint8_t>(seed >> 24);
    image.pixels.push_back(v < 40 ? 0 : v > 215 ? 255 : v);
  }
  return image;
}

TEST(ImagePipeline, Resize_SameBytesAsPlainFixedPointSums) {
  // Up, down by a little and by a lot (wide kernels, odd tap counts), one
  // pixel wide, and one side kept.
  const std::vector<std::array<int, 4>> cases = {
      {40, 56, 24, 24}, {17, 13, 50, 61}, {300, 200, 7, 11}, {1, 9, 5, 4},    {9, 1, 4, 5},
      {64, 64, 64, 20}, {64, 64, 20, 64}, {33, 97, 32, 33},  {5, 1100, 5, 3}, {2, 2, 1, 1}};
  for (const auto& [h, w, out_h, out_w] : cases) {
    const RgbImage in = Noise(h, w, static_cast<uint32_t>(h * 1000 + w));
    RgbImage want = in;
    if (out_w != w) want = PlainPass(want, out_w, /*along_x=*/true);
    if (out_h != h) want = PlainPass(want, out_h, /*along_x=*/false);
    EXPECT_EQ(Resize(in, out_h, out_w).pixels, want.pixels)
        << h << "x" << w << " to " << out_h << "x" << out_w;
  }
}

TEST(ImagePipeline, Validate_NamesTheStep) {
  ImagePipeline p = Training();
  EXPECT_THAT(ValidatePipeline(p), IsOk());
  p.steps[0].scale = {0.5, 0.2};
  EXPECT_THAT(ValidatePipeline(p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("transforms[0]")));
  p = Training();
  p.steps[1].p = 1.5;
  EXPECT_THAT(ValidatePipeline(p), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("transforms[1]: RandomHorizontalFlip")));
  p = Training();
  p.normalize->std[2] = 0;
  EXPECT_THAT(ValidatePipeline(p), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ddp
