#include "worker/data/image_folder_source.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/data/image_decode.h"

namespace ddp {

absl::StatusOr<std::shared_ptr<const ImageFolderSource>> ImageFolderSource::Open(
    const std::string& root, ImagePipeline pipeline, uint64_t seed, uint64_t limit) {
  if (absl::Status s = ValidatePipeline(pipeline); !s.ok()) return s;
  absl::StatusOr<ImageFolder> folder = ImageFolder::Scan(root, limit);
  if (!folder.ok()) return folder.status();
  std::shared_ptr<ImageFolderSource> source(
      new ImageFolderSource(*std::move(folder), std::move(pipeline), seed));
  const ImageSample& first = source->folder_.samples().front();
  absl::StatusOr<RgbImage> image = ReadImage(first.path);
  if (!image.ok()) return image.status();
  int height = 0, width = 0;
  (void)RunPipeline(source->pipeline_, *std::move(image), seed, 0, 0, &height, &width);
  source->shape_ = {3, height, width};
  return std::shared_ptr<const ImageFolderSource>(std::move(source));
}

absl::StatusOr<int64_t> ImageFolderSource::Read(int64_t index, uint64_t epoch, float* out) const {
  const ImageSample& sample = folder_.samples().at(static_cast<size_t>(index));
  absl::StatusOr<RgbImage> image = ReadImage(sample.path);
  if (!image.ok()) return image.status();
  int height = 0, width = 0;
  const std::vector<float> tensor =
      RunPipeline(pipeline_, *std::move(image), seed_, epoch, index, &height, &width);
  if (height != shape_[1] || width != shape_[2]) {
    return absl::InvalidArgumentError(
        absl::StrCat(sample.path, ": comes out ", height, "x", width, " where the samples are ",
                     shape_[1], "x", shape_[2],
                     " (end the transforms with a CenterCrop, RandomResizedCrop or Resize to "
                     "[height, width])"));
  }
  std::copy(tensor.begin(), tensor.end(), out);
  return sample.label;
}

}  // namespace ddp
