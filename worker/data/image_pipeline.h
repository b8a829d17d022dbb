// A job's image transforms, torchvision's names and semantics, run on one
// decoded sample: Resize, CenterCrop, RandomResizedCrop,
// RandomHorizontalFlip, then ToTensor and Normalize. The random ones draw
// from SampleRandom(seed, epoch, index) only, in the order the steps are
// listed, so a sample's tensor depends on nothing else (not the thread
// that made it, nor how many there are).
//
// No LibTorch: 3 x height x width floats.
#ifndef DDP_WORKER_DATA_IMAGE_PIPELINE_H_
#define DDP_WORKER_DATA_IMAGE_PIPELINE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "worker/data/image_decode.h"
#include "worker/data/image_transforms.h"
#include "worker/data/sample_random.h"

namespace ddp {

struct ImageStep {
  enum class Kind { kResize, kCenterCrop, kRandomResizedCrop, kRandomHorizontalFlip };
  Kind kind = Kind::kResize;
  // Resize: `height` 0 means "the shorter side becomes `width`"
  // (transforms.Resize(int)). CenterCrop, RandomResizedCrop: the output.
  int height = 0;
  int width = 0;
  // RandomResizedCrop: torchvision's defaults.
  std::array<double, 2> scale = {0.08, 1.0};
  std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0};
  // RandomHorizontalFlip.
  double p = 0.5;
};

struct ImagePipeline {
  std::vector<ImageStep> steps;
  std::optional<Normalization> normalize;
};

// INVALID_ARGUMENT naming the step (by position) and what is wrong: sizes
// out of [1, 65536], scale outside (0, 1] or unordered, ratio not positive
// or unordered, p outside [0, 1].
absl::Status ValidatePipeline(const ImagePipeline& pipeline);

// RandomResizedCrop.get_params: (top, left, height, width) of the crop, ten
// tries at a random area and aspect ratio, else the largest central crop
// within the ratio.
std::array<int, 4> RandomResizedCropBox(int image_height, int image_width,
                                        const std::array<double, 2>& scale,
                                        const std::array<double, 2>& ratio, SampleRandom& random);

// The steps, then ToTensor and Normalize; *height and *width get the
// output's size.
std::vector<float> RunPipeline(const ImagePipeline& pipeline, RgbImage image, uint64_t seed,
                               uint64_t epoch, int64_t index, int* height, int* width);

// RunPipeline with the tensor written straight into `out` (the caller's
// 3 x height x width floats), and only when the image comes out
// height x width: returns the size it came out, {height, width}.
std::array<int, 2> RunPipelineInto(const ImagePipeline& pipeline, RgbImage image, uint64_t seed,
                                   uint64_t epoch, int64_t index, int height, int width,
                                   float* out);

}  // namespace ddp

#endif  // DDP_WORKER_DATA_IMAGE_PIPELINE_H_
