#include "worker/data/image_pipeline.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

// Python's round() to an int: halves to the even neighbour.
int RoundHalfEven(double v) { return static_cast<int>(std::nearbyint(v)); }

absl::Status StepError(size_t i, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("transforms[", i, "]: ", what));
}

bool SizeOk(int v) { return v >= 1 && v <= 65536; }

}  // namespace

absl::Status ValidatePipeline(const ImagePipeline& pipeline) {
  for (size_t i = 0; i < pipeline.steps.size(); ++i) {
    const ImageStep& s = pipeline.steps[i];
    switch (s.kind) {
      case ImageStep::Kind::kResize:
        if (!SizeOk(s.width) || (s.height != 0 && !SizeOk(s.height))) {
          return StepError(i, "Resize: sizes must be in [1, 65536]");
        }
        break;
      case ImageStep::Kind::kCenterCrop:
      case ImageStep::Kind::kRandomResizedCrop:
        if (!SizeOk(s.width) || !SizeOk(s.height)) {
          return StepError(i, "the output size must be in [1, 65536]");
        }
        if (s.kind == ImageStep::Kind::kRandomResizedCrop &&
            !(s.scale[0] > 0 && s.scale[0] <= s.scale[1] && s.scale[1] <= 1)) {
          return StepError(i, "RandomResizedCrop: scale must be (lo, hi) with 0 < lo <= hi <= 1");
        }
        if (s.kind == ImageStep::Kind::kRandomResizedCrop &&
            !(s.ratio[0] > 0 && s.ratio[0] <= s.ratio[1] && std::isfinite(s.ratio[1]))) {
          return StepError(i, "RandomResizedCrop: ratio must be (lo, hi) with 0 < lo <= hi");
        }
        break;
      case ImageStep::Kind::kRandomHorizontalFlip:
        if (!(s.p >= 0 && s.p <= 1)) return StepError(i, "RandomHorizontalFlip: p in [0, 1]");
        break;
    }
  }
  if (pipeline.normalize) {
    for (float s : pipeline.normalize->std) {
      if (!(s > 0) || !std::isfinite(s)) {
        return absl::InvalidArgumentError("Normalize: every std must be > 0");
      }
    }
  }
  return absl::OkStatus();
}

std::array<int, 4> RandomResizedCropBox(int image_height, int image_width,
                                        const std::array<double, 2>& scale,
                                        const std::array<double, 2>& ratio, SampleRandom& random) {
  const double area = static_cast<double>(image_height) * image_width;
  const double log_lo = std::log(ratio[0]), log_hi = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * random.Uniform(scale[0], scale[1]);
    const double aspect = std::exp(random.Uniform(log_lo, log_hi));
    const int w = RoundHalfEven(std::sqrt(target_area * aspect));
    const int h = RoundHalfEven(std::sqrt(target_area / aspect));
    if (0 < w && w <= image_width && 0 < h && h <= image_height) {
      const int top = static_cast<int>(random.Integer(0, image_height - h + 1));
      const int left = static_cast<int>(random.Integer(0, image_width - w + 1));
      return {top, left, h, w};
    }
  }
  // Fallback: the largest central crop within the ratio.
  const double in_ratio = static_cast<double>(image_width) / image_height;
  int w = image_width, h = image_height;
  if (in_ratio < ratio[0]) {
    h = RoundHalfEven(w / ratio[0]);
  } else if (in_ratio > ratio[1]) {
    w = RoundHalfEven(h * ratio[1]);
  }
  return {(image_height - h) / 2, (image_width - w) / 2, h, w};
}

std::vector<float> RunPipeline(const ImagePipeline& pipeline, RgbImage image, uint64_t seed,
                               uint64_t epoch, int64_t index, int* height, int* width) {
  SampleRandom random(seed, epoch, index);
  for (const ImageStep& s : pipeline.steps) {
    switch (s.kind) {
      case ImageStep::Kind::kResize:
        image = s.height == 0 ? ResizeShorter(image, s.width) : Resize(image, s.height, s.width);
        break;
      case ImageStep::Kind::kCenterCrop:
        image = CenterCrop(image, s.height, s.width);
        break;
      case ImageStep::Kind::kRandomResizedCrop: {
        const auto [top, left, h, w] =
            RandomResizedCropBox(image.height, image.width, s.scale, s.ratio, random);
        image = Resize(Crop(image, top, left, h, w), s.height, s.width);
        break;
      }
      case ImageStep::Kind::kRandomHorizontalFlip:
        if (random.Uniform() < s.p) image = HorizontalFlip(image);
        break;
    }
  }
  *height = image.height;
  *width = image.width;
  return ToTensorChw(image, pipeline.normalize);
}

}  // namespace ddp
