// A sample's augmentation is a function of (seed, epoch, index) alone: the
// same tensor whatever thread makes it and however many there are; the
// random crop's box is always inside the image, in torchvision's scale and
// ratio bounds, else its central fallback; bad pipelines are refused. (That
// each step equals torchvision's is image_folder_parity_test.py.)
#include "worker/data/image_pipeline.h"

#include <cmath>
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
