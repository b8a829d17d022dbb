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

namespace {

using Steps = std::vector<ImageStep>;

// Steps [begin, end) on one image. A flip that only other flips follow is
// left to the tensor's writer (*flipped: whether one is owed), which
// mirrors as it writes instead of copying the image.
RgbImage ApplySteps(Steps::const_iterator begin, Steps::const_iterator end, RgbImage image,
                    SampleRandom& random, bool* flipped) {
  *flipped = false;
  for (auto s = begin; s != end; ++s) {
    if (s->kind != ImageStep::Kind::kRandomHorizontalFlip && *flipped) {
      image = HorizontalFlip(image);
      *flipped = false;
    }
    switch (s->kind) {
      case ImageStep::Kind::kResize:
        image =
            s->height == 0 ? ResizeShorter(image, s->width) : Resize(image, s->height, s->width);
        break;
      case ImageStep::Kind::kCenterCrop:
        image = CenterCrop(image, s->height, s->width);
        break;
      case ImageStep::Kind::kRandomResizedCrop: {
        const auto [top, left, h, w] =
            RandomResizedCropBox(image.height, image.width, s->scale, s->ratio, random);
        image = ResizedCrop(image, top, left, h, w, s->height, s->width);
        break;
      }
      case ImageStep::Kind::kRandomHorizontalFlip:
        if (random.Uniform() < s->p) *flipped = !*flipped;
        break;
    }
  }
  return image;
}

// Flips only: whether the image comes out mirrored.
bool DrawFlips(Steps::const_iterator begin, Steps::const_iterator end, SampleRandom& random) {
  bool flipped = false;
  for (auto s = begin; s != end; ++s) {
    if (random.Uniform() < s->p) flipped = !flipped;
  }
  return flipped;
}

// The last step that is not a flip, when it is one that can write the
// tensor as it resizes (RandomResizedCrop, Resize to both sides); else the
// end.
Steps::const_iterator FusedStep(const Steps& steps) {
  auto last = steps.end();
  for (auto s = steps.begin(); s != steps.end(); ++s) {
    if (s->kind != ImageStep::Kind::kRandomHorizontalFlip) last = s;
  }
  if (last == steps.end()) return last;
  const bool fusable = last->kind == ImageStep::Kind::kRandomResizedCrop ||
                       (last->kind == ImageStep::Kind::kResize && last->height != 0);
  return fusable ? last : steps.end();
}

}  // namespace

std::vector<float> RunPipeline(const ImagePipeline& pipeline, RgbImage image, uint64_t seed,
                               uint64_t epoch, int64_t index, int* height, int* width) {
  const auto fused = FusedStep(pipeline.steps);
  if (fused != pipeline.steps.end()) {
    // The size is known before the image is read: the resize writes the
    // tensor itself.
    *height = fused->height;
    *width = fused->width;
    std::vector<float> tensor(static_cast<size_t>(*width) * *height * 3);
    RunPipelineInto(pipeline, std::move(image), seed, epoch, index, *height, *width, tensor.data());
    return tensor;
  }
  SampleRandom random(seed, epoch, index);
  bool flipped = false;
  const RgbImage out =
      ApplySteps(pipeline.steps.begin(), pipeline.steps.end(), std::move(image), random, &flipped);
  *height = out.height;
  *width = out.width;
  std::vector<float> tensor(static_cast<size_t>(out.width) * out.height * 3);
  ToTensorChwInto(out, pipeline.normalize, flipped, tensor.data());
  return tensor;
}

std::array<int, 2> RunPipelineInto(const ImagePipeline& pipeline, RgbImage image, uint64_t seed,
                                   uint64_t epoch, int64_t index, int height, int width,
                                   float* out) {
  SampleRandom random(seed, epoch, index);
  bool flipped = false;
  const auto fused = FusedStep(pipeline.steps);
  if (fused == pipeline.steps.end()) {
    const RgbImage result = ApplySteps(pipeline.steps.begin(), pipeline.steps.end(),
                                       std::move(image), random, &flipped);
    if (result.height == height && result.width == width) {
      ToTensorChwInto(result, pipeline.normalize, flipped, out);
    }
    return {result.height, result.width};
  }
  // The steps before the fused one, then its box (drawn in step order),
  // then the flips after it.
  image = ApplySteps(pipeline.steps.begin(), fused, std::move(image), random, &flipped);
  if (flipped) image = HorizontalFlip(image);
  std::array<int, 4> box = {0, 0, image.height, image.width};
  if (fused->kind == ImageStep::Kind::kRandomResizedCrop) {
    box = RandomResizedCropBox(image.height, image.width, fused->scale, fused->ratio, random);
  }
  flipped = DrawFlips(fused + 1, pipeline.steps.end(), random);
  if (fused->height == height && fused->width == width) {
    ResizedCropToTensor(image, box[0], box[1], box[2], box[3], height, width, pipeline.normalize,
                        flipped, out);
  }
  return {fused->height, fused->width};
}

}  // namespace ddp
