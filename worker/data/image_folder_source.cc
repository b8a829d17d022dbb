#include "worker/data/image_folder_source.h"

#include <utility>

#include "worker/data/image_decode.h"
#include "worker/data/image_sample.h"

namespace ddp {

absl::StatusOr<std::shared_ptr<const ImageFolderSource>> ImageFolderSource::Open(
    const std::string& root, ImagePipeline pipeline, uint64_t seed, uint64_t limit) {
  if (absl::Status s = ValidatePipeline(pipeline); !s.ok()) return s;
  absl::StatusOr<ImageFolder> folder = ImageFolder::Scan(root, limit);
  if (!folder.ok()) return folder.status();
  std::shared_ptr<ImageFolderSource> source(
      new ImageFolderSource(*std::move(folder), std::move(pipeline), seed));
  const ImageSample& first = source->folder_.samples().front();
  absl::StatusOr<RgbImage> image = ReadImage(first.path, first.size);
  if (!image.ok()) return image.status();
  source->shape_ = TransformedShape(source->pipeline_, *std::move(image), seed);
  return std::shared_ptr<const ImageFolderSource>(std::move(source));
}

absl::StatusOr<int64_t> ImageFolderSource::Read(int64_t index, uint64_t epoch, float* out) const {
  const ImageSample& sample = folder_.samples().at(static_cast<size_t>(index));
  absl::StatusOr<RgbImage> image = ReadImage(sample.path, sample.size);
  if (!image.ok()) return image.status();
  if (absl::Status s = TransformInto(pipeline_, *std::move(image), seed_, epoch, index, shape_,
                                     sample.path, out);
      !s.ok()) {
    return s;
  }
  return sample.label;
}

}  // namespace ddp
