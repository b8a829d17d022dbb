#include "worker/data/image_sample.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ddp {

std::vector<int64_t> TransformedShape(const ImagePipeline& pipeline, RgbImage image,
                                      uint64_t seed) {
  int height = 0, width = 0;
  (void)RunPipeline(pipeline, std::move(image), seed, 0, 0, &height, &width);
  return {3, height, width};
}

absl::Status TransformInto(const ImagePipeline& pipeline, RgbImage image, uint64_t seed,
                           uint64_t epoch, int64_t index, const std::vector<int64_t>& shape,
                           absl::string_view name, float* out) {
  int height = 0, width = 0;
  const std::vector<float> tensor =
      RunPipeline(pipeline, std::move(image), seed, epoch, index, &height, &width);
  if (height != shape[1] || width != shape[2]) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": comes out ", height, "x", width, " where the samples are ", shape[1],
                     "x", shape[2],
                     " (end the transforms with a CenterCrop, RandomResizedCrop or Resize to "
                     "[height, width])"));
  }
  std::copy(tensor.begin(), tensor.end(), out);
  return absl::OkStatus();
}

}  // namespace ddp
