#include "worker/data/image_sample.h"

#include <array>
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
  const int height = static_cast<int>(shape[1]), width = static_cast<int>(shape[2]);
  const std::array<int, 2> made =
      RunPipelineInto(pipeline, std::move(image), seed, epoch, index, height, width, out);
  if (made[0] != height || made[1] != width) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": comes out ", made[0], "x", made[1], " where the samples are ", height, "x", width,
        " (end the transforms with a CenterCrop, RandomResizedCrop or Resize to "
        "[height, width])"));
  }
  return absl::OkStatus();
}

}  // namespace ddp
